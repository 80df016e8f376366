"""A job resized 2 -> 3 -> 1 workers at checkpoints (local MWMS processes, chief + N workers) with the
global batch kept: the job's example-id record (trainer/state/ledger.py) has the digest of the same
job never resized, every example once per epoch across an epoch boundary, and the loss in its range."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cluster.local import launch

pytestmark = pytest.mark.cluster
BATCH = 48  # x 3 replicas = a global batch of 144, which 4 and 2 replicas divide
SEGMENTS = ((2, 40), (3, 80), (1, 120))  # (workers, steps): 120 steps of 144 pass the first epoch (16384)


def _run(tmp_path, name: str, workers: int, steps: int) -> subprocess.CompletedProcess:
    job = tmp_path / name
    done = launch(
        "--steps", str(steps), "--per-replica-batch", str(BATCH), "--save-every", "20",
        "--resize-keep", "global-batch", "--checkpoint-dir", str(job / "ckpt"), "--output-dir", str(job / "out"),
        workers=workers,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _record(tmp_path, name: str) -> tuple[str, dict]:
    out = tmp_path / name / "out"
    check = subprocess.run(
        [sys.executable, "-m", "trainer.state.ledger", str(out)], capture_output=True, text=True, check=False
    )
    print(check.stdout, check.stderr)
    assert check.returncode == 0, check.stdout + check.stderr
    return check.stdout, json.loads((out / "chief.json").read_text())


def test_resized_2_3_1_sees_what_the_unresized_job_sees(tmp_path):
    _run(tmp_path, "whole", 2, SEGMENTS[-1][1])
    logs = [_run(tmp_path, "resized", *SEGMENTS[0])]
    early = json.loads((tmp_path / "resized" / "out" / "chief.json").read_text())["loss"]  # at step 40
    logs += [_run(tmp_path, "resized", w, s) for w, s in SEGMENTS[1:]]
    lines = [
        ln for done in logs for ln in (done.stdout + done.stderr).splitlines() if "chief: resized at" in ln
    ]
    assert len(lines) == 2 and "3 -> 4 replicas, global batch 144 -> 144 (4 x 36)" in lines[0], lines
    assert "4 -> 2 replicas, global batch 144 -> 144 (2 x 72)" in lines[1], lines
    whole, whole_chief = _record(tmp_path, "whole")
    resized, resized_chief = _record(tmp_path, "resized")
    assert whole.split("digest ")[1] == resized.split("digest ")[1]
    assert "each example once per epoch" in resized and "1.05 epochs" in resized
    assert resized_chief["final_step"] == SEGMENTS[-1][1]
    # The loss of the resized job is where the unresized one ended, well inside what training moved it.
    assert abs(resized_chief["loss"] - whole_chief["loss"]) < 0.25 * abs(early - whole_chief["loss"]) + 1e-3
