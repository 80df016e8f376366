"""A kill in the middle of an asynchronous save (issue 49): the chief's writer is held between a save's
files and its manifest (--fault chief:save-block@STEP), every task is SIGKILLed while it is held, and
the worker's copy goes with its container's tmpfs. No manifest may name the cut save; the restarted
cluster restores the save before it (intact) and loses only the save that was in flight."""

from __future__ import annotations

import re
import shutil
import time

import pytest

from tests.cluster.test_resume_cluster import _summaries, _unshared, start_unshared
from trainer.state import manifest

pytestmark = pytest.mark.cluster
SAVE_EVERY = 20
CUT = 3 * SAVE_EVERY
PROGRESS = re.compile(r"chief \| step (\d+)/")


def _steps_seen(log: str) -> list[tuple[float, int]]:
    return [(time.monotonic(), int(m)) for m in PROGRESS.findall(log)]


def _run_until_the_cut(tmp_path, dirs: dict[str, str]) -> tuple[str, int]:
    """Chief + worker-0 until the chief's writer holds the save of CUT, then both SIGKILLed. The chief's
    output, and the newest step its log showed before the kill."""
    procs, logs = start_unshared(
        tmp_path,
        dirs,
        TRAINER_STEPS="100000",
        TRAINER_SAVE_EVERY=str(SAVE_EVERY),
        TRAINER_SAVE_SECONDS="0",
        TRAINER_LOG_EVERY="5",
        TRAINER_FAULT=f"chief:save-block@{CUT}",
    )
    try:
        # Start-up (TensorFlow's import, the cluster, tracing) has no rate to size from: the other
        # cluster tests' bound. Then the fault must come within 10x the time the measured rate gives.
        deadline, first = time.monotonic() + 240, None
        while "fault injected" not in (text := logs["chief"].read_text()):
            assert all(p.poll() is None for p in procs), text[-3000:]
            seen = PROGRESS.findall(text)
            if seen and first is None:
                first = (time.monotonic(), int(seen[0]))
            elif first and int(seen[-1]) > first[1]:
                rate = (int(seen[-1]) - first[1]) / max(time.monotonic() - first[0], 1e-3)
                deadline = min(deadline, first[0] + 10 * (CUT - first[1]) / rate + 10)
            assert time.monotonic() < deadline, f"no cut save in time: {text[-3000:]}"
            time.sleep(0.1)
        # The cut is held: what a kill now finds on disk.
        chief = dirs["chief"]
        assert manifest.files_of(f"{chief}/ckpt-{CUT}"), "the cut save's files are written"
        for step in manifest.steps_in(chief):
            prefix = f"{chief}/ckpt-{step}"
            if manifest.damage(prefix) is None:
                assert step < CUT
            else:  # no manifest: never one naming a partial save
                assert "never finished" in manifest.damage(prefix), manifest.damage(prefix)
        assert manifest.scan(chief).step == CUT - SAVE_EVERY
    finally:
        for p in procs:
            p.kill()
            p.wait()
    text = logs["chief"].read_text()
    return text, max((int(s) for s in PROGRESS.findall(text)), default=0)


def test_a_kill_mid_asynchronous_save_restores_the_save_before_it(tmp_path):
    dirs = {"chief": str(tmp_path / "volume"), "worker": str(tmp_path / "tmpfs")}
    out, killed_at = _run_until_the_cut(tmp_path, dirs)
    assert "fault injected" in out
    shutil.rmtree(
        dirs["worker"]
    )  # the worker's tmpfs, emptied by `docker kill` and start: its copy of CUT is gone
    result = tmp_path / "out"
    outs = _unshared(
        tmp_path,
        dirs,
        TRAINER_STEPS=str(CUT + SAVE_EVERY),
        TRAINER_SAVE_EVERY=str(SAVE_EVERY),
        TRAINER_OUTPUT_DIR=str(result),
    )
    restored = CUT - SAVE_EVERY
    assert [s["start_step"] for s in _summaries(result)] == [restored, restored], outs[0][-3000:]
    assert f"skipping checkpoint {dirs['chief']}/ckpt-{CUT}: no ckpt-{CUT}.manifest.json" in outs[0], outs[0][
        -3000:
    ]
    # Lost: the save in flight and what trained after it; the writer was held, so the loop went on to
    # the next save and waited there. A write of ~0.1 s loses the interval plus the steps of that write.
    assert restored <= killed_at <= CUT + SAVE_EVERY, (killed_at, out[-2000:])
    assert manifest.scan(dirs["chief"]).step == CUT + SAVE_EVERY
