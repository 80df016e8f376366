"""`make resize WORKERS=N` on a running Compose job (a project of its own): 1 -> 2 -> 0 workers with
the global batch kept (48 = 2 x 24 = 3 x 16 = 1 x 48). Each resize says what changed in one line, every
task saves the same step and the job goes on from it (0 steps lost), the step count continues to
STEPS, and `make status` shows the new size; a resize to the same size is refused in one line.
Timings and throughputs are printed (docs/faults.md)."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from tests.e2e import places
from tests.e2e.conftest import engine_ready
from tests.e2e.faultstack import STEP_LINE, FaultStack, stamp

pytestmark = pytest.mark.docker
STACK = FaultStack(
    places.RESIZE.project,
    f".run/{places.RESIZE.project}",
    os.environ.get("RESIZE_BIND", places.RESIZE.bind),
    {"PER_REPLICA_BATCH": "24", "RESIZE_KEEP": "global-batch", "SAVE_EVERY": "1000"},
)
SAVED = re.compile(r"every task saved step (\d+)")
RATE = re.compile(r"\| ([\d.]+) steps/s")


class Follow:
    """`docker logs -f` of the chief's container of this size: its last lines outlive the container."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            ["docker", "logs", "-f", "-t", STACK.container("chief")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def lines(self) -> list[str]:
        out, _ = self.proc.communicate(timeout=120)  # the container stopped: the stream ends
        return out.splitlines()


@pytest.fixture(scope="module")
def job():
    engine_ready()
    STACK.make("clean", "FORCE=1", timeout=300)
    # An input delay: flat out the job took 0.75 of a core for the module's 152 s (115 CPU-s), which the
    # modules beside it need; a resize's saves and restarts are the same. At 40 ms (25 steps a second,
    # as the fault modules' jobs) it takes half 20 ms's CPU.
    up = STACK.make("up", "WORKERS=1", "STEPS=10000000", "INPUT_DELAY_MS=40", timeout=1800)
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    yield STACK
    STACK.make("clean", "FORCE=1", timeout=300)


def _resumed(timeout: float) -> int:
    """The step the new size's chief resumed at, once it says so (`up -d` returns before)."""
    deadline = time.time() + timeout
    while not (found := STACK.resumes()):
        assert time.time() < deadline, STACK.logs()[-30:]
        time.sleep(0.5)
    return found[-1][1]


def _resize(workers: int, end_after_s: float | None = None) -> dict:
    """One resize: what it printed, its wall time, the step saved, the step resumed, the first step after.
    `end_after_s`: STEPS set to where the job is now plus that many seconds of its steps (and 300)."""
    STACK.wait_for_step(1, timeout=600)  # this size trains (a cold start: TensorFlow's import, tracing)
    seen = STACK.chief_steps()[-1][1]
    STACK.wait_for_step(seen + 200, timeout=300)  # training at this size, its rate in the log
    now = [m for m in map(STEP_LINE.match, STACK.logs()) if m][-1]
    rate = float(RATE.search(now.string)[1])
    extra = () if end_after_s is None else (f"STEPS={int(now[2]) + int(rate * end_after_s) + 300}",)
    before, start = Follow(), time.time()
    done = STACK.make("resize", f"WORKERS={workers}", *extra, timeout=900)
    took = time.time() - start
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    old = before.lines()
    saved = [int(m[1]) for m in map(SAVED.search, old) if m]
    last = max(int(m[2]) for m in map(STEP_LINE.match, old) if m)
    resumed = _resumed(timeout=600)
    first = STACK.wait_for_step(resumed + 1, timeout=300)
    first_line = next(stamp(ln) for ln in STACK.logs() if (m := STEP_LINE.match(ln)) and int(m[2]) > resumed)
    return {"out": done.stderr, "args": " ".join(extra), "saved": saved, "last": last, "resumed": resumed,
            "rate": rate, "make_s": took, "first_step_s": min(first, first_line) - start}  # fmt: skip


def test_resize_1_2_0_goes_on_from_the_saved_step_to_the_end(job):
    refused = STACK.make("resize", "WORKERS=1")
    assert refused.returncode == 2 and "already trains with WORKERS=1: nothing to resize" in refused.stderr
    grow = _resize(2)
    assert "2 -> 3 replicas, global batch 48 -> 48 (3 x 16)" in grow["out"], grow["out"]
    for task in ("worker-0", "worker-1"):  # no copy of their own (tmpfs): the chief's batch, not the flag's
        assert any("global batch 48 = 3 x 16" in ln for ln in STACK.logs(task)), STACK.logs(task)[-20:]
    # The end: past the step this resize will save, sized from the first resize's wall time (3x, at
    # least 30 s: the save is inside it; the restart after it adds no step). Sized from the first step
    # after the restart (TensorFlow's start, tracing), a loaded run trained ~10 min past the resize.
    shrink = _resize(0, end_after_s=max(30.0, 3 * grow["make_s"]))
    steps = int(re.search(r"STEPS=(\d+)", shrink["args"])[1])
    assert "3 -> 1 replicas, global batch 48 -> 48 (1 x 48)" in shrink["out"], shrink["out"]
    for r in (grow, shrink):
        print({k: v for k, v in r.items() if k not in ("out", "args")})
        assert r["saved"] == [r["resumed"]] and r["last"] <= r["resumed"], r  # 0 steps lost
    assert STACK.wait_code(timeout=600) == 0
    assert STACK.checkpoint_step() == steps and STACK.chief_steps()[-1][1] == steps
    status = STACK.make("status").stdout.splitlines()
    assert [ln.split()[0] for ln in status if ln.startswith(("chief", "worker"))] == ["chief"], status
