"""Resuming a real MWMS cluster (chief + 1 worker as processes) across SIGKILLs: the input position,
what non-chiefs keep of their own copies, a resume with new settings on every task, and a resume
from a worker's copy when the chief's folder is gone."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from bench.launch import free_ports
from tests.cluster.local import ROOT
from trainer.cluster.spec import on_ports
from trainer.state import checkpoint, manifest

pytestmark = pytest.mark.cluster
BATCH = "8"  # 1024 steps per epoch of a pipeline's shard: every run here stays inside the first epoch


def _env(tmp_path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_") and k != "TF_CONFIG"}
    return {**env, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path), **extra}


def _launch(tmp_path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "bench.launch", "--workers", "1", "--metrics-port", "0"]
    cmd += ["--per-replica-batch", BATCH, *args]
    log = open(tmp_path / "launch.log", "a")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(cmd, cwd=ROOT, env=_env(tmp_path / "tmp"), stdout=log, stderr=subprocess.STDOUT)


def _log(tmp_path, tail: int = 4000) -> str:
    """The launches' output, its last `tail` characters (for a failure's message; 0: all of it)."""
    return (tmp_path / "launch.log").read_text()[-tail:]


def _finish(tmp_path, *args: str) -> None:
    proc = _launch(tmp_path, *args)
    assert proc.wait(timeout=300) == 0, _log(tmp_path)


def _ids(out) -> set[int]:
    ids = [json.load(open(out / f"{t}.json"))["example_ids"] for t in ("chief", "worker-0")]
    assert not set(ids[0]) & set(ids[1]), "tasks overlapped"
    return set(ids[0]) | set(ids[1])


def _latest(ckpt) -> int:
    """The newest step a task saved whole (its manifest written), in the chief's folder or a replica's:
    what the next run resumes from. Not the chief's alone: a kill in the chief's save leaves its newest
    copy unfinished while a worker's is whole (the trial that found it: chief's 160, worker-0's 180,
    resumed at 180)."""
    folders = [ckpt, *(ckpt / "replicas").glob("*")] if (ckpt / "replicas").is_dir() else [ckpt]
    found = [
        int(m.group(1))
        for folder in folders
        for n in os.listdir(folder)
        if (m := re.match(r"ckpt-(\d+)\.manifest\.json$", n))
    ]
    return max(found, default=0)


def test_input_resumes_across_kills_and_copies_do_not_pile_up(tmp_path):
    ckpt = tmp_path / "ckpt"
    worker = checkpoint.task_dir(str(ckpt), "worker-0", is_chief=False)
    (tmp_path / "tmp").mkdir()
    left, kept = [], []
    # Each run is killed after two saves of its own: three kills leave at least six steps behind, past
    # the bound below, were the copies to pile up (each cluster's start costs ~15 CPU-seconds).
    for _ in range(3):
        before = _latest(ckpt) if ckpt.exists() else 0
        proc = _launch(tmp_path, "--steps", "100000", "--save-every", "20", "--checkpoint-dir", str(ckpt))
        deadline = time.monotonic() + 240
        while not ckpt.exists() or _latest(ckpt) < before + 40:
            assert proc.poll() is None and time.monotonic() < deadline, _log(tmp_path)
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)  # its tasks die with it (PR_SET_PDEATHSIG)
        proc.wait()
        time.sleep(1)
        left.append(len([n for n in os.listdir(tmp_path / "tmp") if n.startswith("trainer-ckpt-")]))
        kept.append(len(manifest.steps_in(worker)))
    assert max(left) <= 1, f"non-chief scratch folders after each kill: {left}"
    # The manager's bound, plus at most one save a kill interrupted (swept by the next save).
    assert 0 < max(kept) <= checkpoint.MAX_TO_KEEP + 1, (
        f"steps in worker-0's own copy after each kill: {kept}"
    )

    at = _latest(ckpt)
    _finish(
        tmp_path, "--steps", str(at + 20), "--checkpoint-dir", str(ckpt), "--output-dir", str(tmp_path / "r")
    )
    # The whole log: the resume's line is early in the last run's output (its tail once missed it).
    assert f"resumed at step {at}" in _log(tmp_path, tail=0), _log(tmp_path)
    _finish(tmp_path, "--steps", str(at), "--output-dir", str(tmp_path / "a"))
    _finish(tmp_path, "--steps", str(at + 20), "--output-dir", str(tmp_path / "b"))
    resumed, before, whole = _ids(tmp_path / "r"), _ids(tmp_path / "a"), _ids(tmp_path / "b")
    assert not resumed & before, f"{len(resumed & before)} examples seen again after the resume"
    assert resumed == whole - before, f"{len(whole - before - resumed)} examples skipped"
    assert not [n for n in os.listdir(tmp_path / "tmp") if n.startswith("trainer-ckpt-")], (
        "a finished run leaves none"
    )


def _unshared(tmp_path, dirs: dict[str, str], **extra: str) -> list[str]:
    """Chief + worker-0 as separate processes, each with its own --checkpoint-dir (`dirs` by task
    type: nothing shared, as on separate hosts); every task's output once both exited 0."""
    procs, logs = start_unshared(tmp_path, dirs, **extra)
    for p in procs:
        p.wait(timeout=300)
    outs = [logs[t].read_text() for t in ("chief", "worker")]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    return outs


def start_unshared(tmp_path, dirs: dict[str, str], **extra: str) -> tuple[list[subprocess.Popen], dict]:
    """Chief + worker-0 started as `_unshared` starts them, their output in `<task>.log` files (by task
    type) for a test that watches them and kills them: the processes and the logs."""
    common = {"TRAINER_PER_REPLICA_BATCH": BATCH, "TRAINER_LR_SCALING": "none", "TRAINER_METRICS_PORT": "0"}
    spec = on_ports("127.0.0.1", free_ports(2))
    logs = {t.type: tmp_path / f"{t.name}.log" for t in spec.tasks}
    procs = []
    for task in spec.tasks:
        env = _env(
            tmp_path, TF_CONFIG=spec.with_task(task).to_tf_config(), TRAINER_CHECKPOINT_DIR=dirs[task.type]
        )
        with open(logs[task.type], "w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "trainer"],
                    cwd=ROOT,
                    env={**env, **common, **extra},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs, logs


def _summaries(out) -> list[dict]:
    return [json.load(open(out / f"{t}.json")) for t in ("chief", "worker-0")]


def test_resume_with_new_settings_keeps_every_task_identical(tmp_path):
    """The worker cannot read the chief's folder, as in the stack: it must still get the new rate."""
    dirs = {"chief": str(tmp_path / "ckpt"), "worker": str(tmp_path / "not-shared")}
    _unshared(tmp_path, dirs, TRAINER_STEPS="20", TRAINER_LEARNING_RATE="0.01")
    out = tmp_path / "out"
    _unshared(
        tmp_path,
        dirs,
        TRAINER_STEPS="40",
        TRAINER_LEARNING_RATE="0.05",
        TRAINER_RESUME_NEW_SETTINGS="1",
        TRAINER_OUTPUT_DIR=str(out),
    )
    summaries = _summaries(out)
    assert [s["start_step"] for s in summaries] == [20, 20]
    assert summaries[0]["weights_sha256"] == summaries[1]["weights_sha256"], "tasks drifted apart"


def test_a_lost_chief_folder_resumes_from_the_workers_copy(tmp_path):
    """Swarm's lost chief node, as processes: the chief's folder is gone, worker-0's own copy is
    not; the job resumes at the worker's step on both tasks, identically."""
    dirs = {"chief": str(tmp_path / "chief-node"), "worker": str(tmp_path / "worker-node")}
    first = tmp_path / "first"
    _unshared(tmp_path, dirs, TRAINER_STEPS="40", TRAINER_SAVE_EVERY="20", TRAINER_OUTPUT_DIR=str(first))
    shutil.rmtree(dirs["chief"])
    out = tmp_path / "out"
    outs = _unshared(tmp_path, dirs, TRAINER_STEPS="60", TRAINER_SAVE_EVERY="20", TRAINER_OUTPUT_DIR=str(out))
    summaries = _summaries(out)
    assert [s["start_step"] for s in summaries] == [40, 40], outs[0][-2000:]
    assert summaries[0]["weights_sha256"] == summaries[1]["weights_sha256"], "tasks drifted apart"
    assert "chief: starting at step 40 (worker-0's)" in outs[0], outs[0][-2000:]
