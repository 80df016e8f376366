"""What a published checkpoint is: its files with sizes and digests, and the settings of the job.

A save is crash-safe in three moves: TensorFlow writes `ckpt-N.index` and `ckpt-N.data-*`; they are
flushed to disk (fsync, then the folder); then `ckpt-N.manifest.json` is written to a temporary
name, flushed and renamed. The manifest is the publication: a checkpoint without one was never
finished (a crash or a full disk mid-save), one whose files differ from it was damaged afterwards.
TensorFlow's own `checkpoint` state file is only bookkeeping here, rewritten from what is intact.

The job settings (`JOB_SETTINGS`) are stored in the manifest, so a start with other settings is
stopped before it trains on a checkpoint that means something else. Standard library only: `make up`
asks it about the checkpoint volume before any task starts (`python -m trainer.state.manifest`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainer import config as config_lib
from trainer.errors import EXIT_CONFIG, ConfigError
from trainer.state import atomic, resize

SUFFIX = ".manifest.json"
PREFIX_RE = re.compile(r"^ckpt-(\d+)(?:\.index|\.data-\d{5}-of-\d{5}|\.manifest\.json)$")
ACCEPT_FLAG = "--resume-new-settings 1"
NOTHING_TO_TRAIN = 10
"""`python -m trainer.state.manifest`'s answer when the checkpoint is already at or past --steps (compose/up.sh
then starts the monitoring but no trainer)."""

JOB_SETTINGS = {
    "task": "another model: the checkpoint's variables would not even match",
    "data": "other examples: the input position and what the model learnt refer to other data",
    "seed": "another initialisation and synthetic teacher: a resumed run would learn another problem",
    "per_replica_batch": "another global batch: the learning rate, its schedule and the input position change meaning",
    "learning_rate": "another rate: the optimizer's moments were accumulated at this one",
    "lr_scaling": "another effective rate for the same batch",
    "warmup_steps": "another schedule: the step counter would sit at another point of it",
    "allreduce_dtype": "other numerics in every gradient",
    "strategy": "another process layout: replicas and input pipelines differ",
}
"""What defines the job, and why a change breaks a resume. Not here: steps (continuing longer is the
point of a resume), save/log intervals, ports, timing and all-reduce packing (same arithmetic), and
the world size (recorded as `replicas`): a resize (trainer/state/resize.py) goes on at a checkpoint,
with the batch and rate its policy gives and the input at its global example offset."""


def job_settings(config: config_lib.Config, replicas: int | None) -> dict[str, object]:
    """The settings that define the job; `replicas` None when not known (before TensorFlow starts)."""
    values = {name: getattr(config, name) for name in JOB_SETTINGS if name != "replicas"}
    values["replicas"] = replicas
    return values


def differences(saved: Mapping[str, object], now: Mapping[str, object]) -> list[str]:
    """One line per job setting that differs; a value unknown on either side (None) is not compared."""
    lines = []
    for name, why in JOB_SETTINGS.items():
        old, new = saved.get(name), now.get(name)
        if old is None or new is None or old == new:
            continue
        shown = f"--{name.replace('_', '-')}"
        lines.append(f"{shown}: checkpoint {old!r}, now {new!r} ({why})")
    return lines


def refusal(directory: str, step: int, lines: Sequence[str]) -> str:
    return (
        f"the checkpoint in {directory} (step {step}) was trained with other job settings:\n  "
        + "\n  ".join(lines)
        + f"\nEither start over (`make clean`, or an empty --checkpoint-dir), or resume with the new "
        f"settings on every task: {ACCEPT_FLAG} (make up RESUME_NEW_SETTINGS=1)"
    )


def manifest_path(prefix: str) -> str:
    return prefix + SUFFIX


def steps_in(directory: str) -> list[int]:
    """Every step that left any checkpoint file in `directory`, newest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted({int(m.group(1)) for n in names if (m := PREFIX_RE.match(n))}, reverse=True)


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def files_of(prefix: str) -> list[str]:
    folder, base = os.path.split(prefix)
    pattern = re.compile(re.escape(base) + r"(\.index|\.data-\d{5}-of-\d{5})$")
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if pattern.match(n))


def publish(prefix: str, step: int, settings: Mapping[str, object], extra: Mapping | None = None) -> None:
    """Flush the checkpoint's files, then write its manifest atomically: from now on it is restorable.
    `extra`: what else the step is (the input offset, the sizing, the resizes so far)."""
    files = files_of(prefix)
    for path in files:
        atomic.fsync_path(path)
    body = {
        "step": step,
        "settings": dict(settings),
        **(extra or {}),
        "files": {os.path.basename(p): {"bytes": os.path.getsize(p), "sha256": _digest(p)} for p in files},
    }
    atomic.write_json(manifest_path(prefix), body, indent=1)


def read(prefix: str) -> dict:
    with open(manifest_path(prefix), encoding="utf-8") as f:
        return json.load(f)


def damage(prefix: str) -> str | None:
    """None when the checkpoint at `prefix` is intact; else why not, in a few words."""
    name = os.path.basename(prefix)
    if not os.path.exists(manifest_path(prefix)):
        return f"no {name}{SUFFIX}: its save never finished (a crash or a full disk during the save)"
    try:
        files = read(prefix)["files"]
        if not files:
            raise ValueError("no files")
    except (OSError, ValueError, KeyError, TypeError):
        return f"{name}{SUFFIX} is garbled"
    folder = os.path.dirname(prefix)
    for base, want in sorted(files.items()):
        path = os.path.join(folder, base)
        if not os.path.exists(path):
            return f"{base} is missing"
        size = os.path.getsize(path)
        if size != want["bytes"]:
            return f"{base} is truncated ({size} of {want['bytes']} bytes)"
        if _digest(path) != want["sha256"]:
            return f"{base} is corrupt (its sha256 differs from the manifest's)"
    return None


@dataclass(frozen=True)
class Scan:
    """The newest intact checkpoint of a folder (or none) and why each newer one was skipped."""

    prefix: str | None
    step: int | None
    skipped: tuple[str, ...]
    intact: tuple[str, ...]
    """Every intact checkpoint's prefix, oldest first."""


def scan(directory: str) -> Scan:
    best, skipped, intact = None, [], []
    for step in steps_in(directory):
        prefix = os.path.join(directory, f"ckpt-{step}")
        why = damage(prefix)
        if why is None:
            intact.append(prefix)
            best = best or (prefix, step)
        elif best is None:
            skipped.append(f"skipping checkpoint {prefix}: {why}")
    prefix, step = best or (None, None)
    return Scan(prefix, step, tuple(skipped), tuple(reversed(intact)))


def newest(scans: Sequence[Scan]) -> Scan:
    """The scan holding the newest intact checkpoint, the first one on a tie (the caller's own folder
    comes first); the first scan when none holds any. Replicas are identical, so any folder's copy of
    a step restores the same job."""
    best = scans[0]
    for found in scans[1:]:
        if found.step is not None and (best.step is None or found.step > best.step):
            best = found
    return best


def check(directory: str, settings: Mapping[str, object], accept_new: bool) -> Scan:
    """The checkpoint a start would resume; a ConfigError naming every job setting that differs from
    its manifest's, unless `accept_new` (--resume-new-settings 1)."""
    return fits(scan(directory), settings, accept_new)


def fits(found: Scan, settings: Mapping[str, object], accept_new: bool) -> Scan:
    """`found`, unless its manifest's job settings differ from `settings` (a ConfigError naming each)."""
    if found.prefix is None or accept_new:
        return found
    lines = differences(read(found.prefix).get("settings", {}), settings)
    if lines:
        raise ConfigError(refusal(os.path.dirname(found.prefix), found.step, lines))
    return found


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    """`make up`'s question before any task starts: does the checkpoint volume fit this job?"""
    p = argparse.ArgumentParser(prog="python -m trainer.state.manifest", description=main.__doc__)
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument(
        "--script",
        action="store_true",
        help="a SCRIPT= run (its own folder, TRAINER_CHECKPOINT_DIR): nothing of the built-in job applies",
    )
    p.add_argument("--replicas", type=int, help="the world size about to start: a resize is said, or refused")
    ns = p.parse_args(argv)
    if ns.script:
        return _script_start(ns.checkpoint_dir, env.get("TRAINER_CHECKPOINT_DIR", "?"))
    try:
        config = config_lib.from_args([], env)
        found = check(ns.checkpoint_dir, job_settings(config, None), bool(config.resume_new_settings))
        if found.prefix and ns.replicas:
            _resize_line(config, read(found.prefix), ns.replicas)
    except ConfigError as err:
        print(f"up: {err}", file=sys.stderr)
        return EXIT_CONFIG
    for line in found.skipped:
        print(f"up: {line}", file=sys.stderr)
    if found.step is not None and found.step >= config.steps:
        print(
            f"up: nothing to train: the checkpoint volume holds step {found.step} of this job "
            f"({', '.join(f'{k}={v}' for k, v in read(found.prefix)['settings'].items() if v is not None)}), "
            f"STEPS={config.steps} asks for no more. STEPS=N above {found.step} to train on, "
            "or `make clean` to start over (the final model stays in OUTPUT=)",
            file=sys.stderr,
        )
        return NOTHING_TO_TRAIN
    if found.step is not None:
        print(f"up: resuming at step {found.step} of {config.steps}", file=sys.stderr)
    return 0


def _script_start(directory: str, script_dir: str) -> int:
    """A SCRIPT= run keeps its checkpoints in its own folder of the volume: the built-in job's settings
    (TASK, LEARNING_RATE, ...) are no flags of a script, and its checkpoint stays for a later `make up`
    of the built-in job (issue 29: a script after the demo was refused over --task and --learning-rate)."""
    found = scan(directory)
    if found.step is not None:
        settings = read(found.prefix).get("settings", {})
        print(
            f"up: the volume also holds the built-in job's checkpoint (task {settings.get('task')}, step "
            f"{found.step}), kept apart: this SCRIPT run checkpoints in {script_dir}; `make clean` deletes both",
            file=sys.stderr,
        )
    return 0


def _resize_line(config: config_lib.Config, body: dict, replicas: int) -> None:
    """One line when the job goes on at another world size; a ConfigError when its policy cannot."""
    before = resize.saved(body)
    if before is None:
        return
    now = resize.plan(
        replicas=replicas, per_replica_batch=config.per_replica_batch, keep=config.resize_keep, before=before
    )
    rates = tuple(resize.rate(config.learning_rate, config.lr_scaling, s) for s in (before, now))
    if line := resize.change(before, now, body["step"], rates):
        print(f"up: {line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
