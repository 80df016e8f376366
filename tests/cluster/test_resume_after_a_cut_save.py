"""`make chaos FAULTS=4 SEED=601207`'s faults 10 and 11 (issue 29), as processes: the chief killed
mid-save of a step resumes at that step from worker-0's copy; then every task is killed before the
next save and worker-0's copy is gone with its container's tmpfs. The job must resume at that step
again, not at the save before it (85 steps lost at SAVE_EVERY=50): the resume saves it anew on
every task whose own folder lacked it (trainer.state.checkpoint.copy_lags)."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from tests.cluster.test_resume_cluster import _summaries, _unshared, start_unshared
from trainer.state import manifest

pytestmark = pytest.mark.cluster
SAVE_EVERY = 20


def _cut_the_chiefs_save(chief_dir: str, step: int) -> None:
    """What SIGKILL mid-save leaves: the step's files, no manifest (it is written last)."""
    os.remove(manifest.manifest_path(os.path.join(chief_dir, f"ckpt-{step}")))
    assert manifest.scan(chief_dir).step == step - SAVE_EVERY


def _run_until_the_hang(tmp_path, dirs: dict[str, str], steps: int, hang: int) -> str:
    """Chief + worker-0 trained until the chief blocks at step `hang` (no save between), then both
    SIGKILLed: every task's container killed at once. The chief's output."""
    procs, logs = start_unshared(
        tmp_path,
        dirs,
        TRAINER_STEPS=str(steps),
        TRAINER_SAVE_EVERY=str(SAVE_EVERY),
        TRAINER_FAULT=f"chief:hang@{hang}",
    )
    try:
        while "fault injected" not in logs["chief"].read_text():
            assert all(p.poll() is None for p in procs), logs["chief"].read_text()[-3000:]
            time.sleep(0.2)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return logs["chief"].read_text()


def test_a_step_restored_from_a_copy_that_is_then_lost_is_kept(tmp_path):
    dirs = {"chief": str(tmp_path / "volume"), "worker": str(tmp_path / "tmpfs")}
    _unshared(tmp_path, dirs, TRAINER_STEPS=str(2 * SAVE_EVERY), TRAINER_SAVE_EVERY=str(SAVE_EVERY))
    cut = 2 * SAVE_EVERY
    _cut_the_chiefs_save(dirs["chief"], cut)
    out = _run_until_the_hang(tmp_path, dirs, steps=4 * SAVE_EVERY, hang=cut + SAVE_EVERY // 2)
    assert f"chief: starting at step {cut} (worker-0's)" in out, out[-3000:]
    shutil.rmtree(dirs["worker"])  # the worker's tmpfs, emptied by `docker kill` and start
    result = tmp_path / "out"
    outs = _unshared(
        tmp_path,
        dirs,
        TRAINER_STEPS=str(4 * SAVE_EVERY),
        TRAINER_SAVE_EVERY=str(SAVE_EVERY),
        TRAINER_OUTPUT_DIR=str(result),
    )
    assert [s["start_step"] for s in _summaries(result)] == [cut, cut], outs[0][-3000:]
