"""The job's record of the example ids it trained on: every task, every segment, across resizes.

Each task appends a chunk at every save (`<output-dir>/examples/<to>-<from>-<task>.json`: the ids of
steps from+1..to, step by step); a resumed job drops the chunks past the step it resumes at (their
steps are trained again). Chained from step 0, the chunks give the job's stream in training order
(per step, the tasks in pipeline order), which proves what the input promises: each example once
per epoch, none skipped, whatever the world size of each segment.

    python -m trainer.state.ledger OUTPUT_DIR      # one line: steps, examples, epochs, digest; exit 1 if broken

The digest (sha256 of the sorted ids) equals an unresized run's when the global batch was kept.
NumPy and the standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from trainer.state import atomic

FOLDER = "examples"
NAME_RE = re.compile(r"^(\d+)-(\d+)-(.+)\.json$")


@dataclass
class Ledger:
    """One task's chunks: an after-call action collecting ids, `flush` at each save."""

    directory: str
    task: str
    rank: int
    """This task's input pipeline (its slice of every global batch)."""
    pipelines: int
    epoch_examples: int | None
    since: int
    pending: list = field(default_factory=list)

    def __call__(self, out) -> None:
        if out.ids is not None:
            self.pending.append(out.ids)

    def flush(self, step: int) -> None:
        if step <= self.since:
            return
        ids = np.concatenate(self.pending) if self.pending else np.zeros(0, np.int64)
        body = {
            "task": self.task,
            "rank": self.rank,
            "pipelines": self.pipelines,
            "from": self.since,
            "to": step,
            "epoch_examples": self.epoch_examples,
            "ids": ids.astype(np.int64).tolist(),
        }
        os.makedirs(self.directory, exist_ok=True)
        atomic.write_json(os.path.join(self.directory, f"{step:09d}-{self.since:09d}-{self.task}.json"), body)
        self.pending, self.since = [], step


class Saving:
    """Checkpoints whose every save first writes the ledger's chunk up to that step."""

    def __init__(self, checkpoints, ledger: Ledger | None) -> None:
        self._checkpoints, self._ledger = checkpoints, ledger

    def save(self, step: int) -> None:
        if self._ledger is not None:
            self._ledger.flush(step)
        self._checkpoints.save(step)


def forget_after(directory: str, step: int) -> list[str]:
    """Remove the chunks of steps past `step` (a resumed job trains them again); the names removed."""
    gone = []
    for name in _names(directory):
        if int(NAME_RE.match(name).group(1)) > step:
            os.remove(os.path.join(directory, name))
            gone.append(name)
    return gone


def _names(directory: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(directory) if NAME_RE.match(n))
    except OSError:
        return []


class LedgerError(ValueError):
    """The chunks do not chain into one stream (a gap, a missing task): the record proves nothing."""


def stream(directory: str) -> tuple[np.ndarray, int, int | None]:
    """The job's ids in training order, the last step, the examples per epoch."""
    groups: dict[tuple[int, int], list[dict]] = {}
    for name in _names(directory):
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            body = json.load(f)
        groups.setdefault((body["from"], body["to"]), []).append(body)
    parts, at, epoch = [], 0, None
    for (start, end), chunks in sorted(groups.items()):
        if start != at:
            raise LedgerError(f"steps {at}..{start} are in no chunk (the next chunk covers {start}..{end})")
        parts.append(_steps(start, end, chunks))
        at, epoch = end, chunks[0]["epoch_examples"]
    return (np.concatenate(parts) if parts else np.zeros(0, np.int64)), at, epoch


def _steps(start: int, end: int, chunks: list[dict]) -> np.ndarray:
    """Steps start+1..end, each the tasks' slices in pipeline order."""
    chunks = sorted(chunks, key=lambda c: c["rank"])
    ranks = [c["rank"] for c in chunks]
    if ranks != list(range(chunks[0]["pipelines"])):
        raise LedgerError(
            f"steps {start}..{end}: chunks of pipelines {ranks}, want 0..{chunks[0]['pipelines'] - 1}"
        )
    rows = [np.asarray(c["ids"], np.int64).reshape(end - start, -1) for c in chunks]
    return np.concatenate(rows, axis=1).reshape(-1)


def problems(ids: np.ndarray, epoch_examples: int | None) -> list[str]:
    """Every epoch must hold each example once: the finished ones all of them, the last no repeat."""
    if not epoch_examples:
        return []
    out = []
    for e, low in enumerate(range(0, ids.size, epoch_examples)):
        part = ids[low : low + epoch_examples]
        repeated = part.size - np.unique(part).size
        if repeated:
            out.append(f"epoch {e}: {repeated} examples repeated")
        if part.size == epoch_examples and np.unique(part).size != epoch_examples:
            out.append(f"epoch {e}: {epoch_examples - np.unique(part).size} examples missing")
    return out


def digest(ids: np.ndarray) -> str:
    return hashlib.sha256(np.sort(ids).astype("<i8").tobytes()).hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.state.ledger", description=__doc__.splitlines()[0])
    p.add_argument("output_dir", help="the job's --output-dir (its examples/ folder)")
    ns = p.parse_args(argv)
    try:
        ids, last, epoch = stream(os.path.join(ns.output_dir, FOLDER))
    except LedgerError as err:
        print(f"ledger: {err}", file=sys.stderr)
        return 1
    found = problems(ids, epoch)
    epochs = f", {ids.size / epoch:.2f} epochs of {epoch}" if epoch else ""
    print(
        f"ledger: steps 0..{last}, {ids.size} examples{epochs}, "
        + ("; ".join(found) if found else "each example once per epoch")
        + f", digest sha256:{digest(ids)}"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
