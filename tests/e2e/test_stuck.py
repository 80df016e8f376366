"""Stuck, not dead: a task alive and heartbeating whose step never ends, on a real stack.

Two faults (the trainer's --fault hook, trainer/core/fault.py), each on worker-1 of its own small job:
its input never delivers a batch (`input-block`), or its host loop stops before the next call, so
it never enters the collective its peers wait in (`hang`). Each run asserts, from outside the trainer,
what an operator sees: the supervisors name worker-1 (and only its supervisor ends it), its Python
stack is in its log, `make diagnose` names it, the TaskStuck alert fired in Prometheus, and the job
resumes from its last checkpoint and finishes (`make wait` returns 0). Recovery time and steps lost
are printed, as in tests/e2e/test_faults.py.

Own project, bind address and image repository (STUCK_PROJECT, STUCK_BIND, IMAGE_REPO), so the
session stack and the fault tests' projects are never touched. Every wait is sized from the step time
this run measured and from the stall bound it sets (SUPERVISE_STALL).
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from tests.e2e import places
from tests.e2e.conftest import engine_ready
from tests.e2e.faultstack import FaultStack, stamp
from trainer.supervise.stall import StallBound

pytestmark = pytest.mark.docker

STEPS = 600
SAVE_EVERY = 50
FAULT_STEP = 170
"""20 steps after the save at 150: the resume loses them."""
STALL = "20,10,60"
"""20 x the p99 step, at least 10 s (a save or a loaded machine must not look stuck), at most 60 s."""
BOUND = StallBound.parse(STALL)
PROJECT = os.environ.get("STUCK_PROJECT", places.STUCK.project)
BIND = os.environ.get("STUCK_BIND", places.STUCK.bind)
TASKS = ("chief", "worker-0", "worker-1")
STUCK_LINE = re.compile(r"^(\S+) supervise: stuck: step stuck at (\d+) for (\d+)s \(bound (\d+)s")


def stack(kind: str) -> FaultStack:
    return FaultStack(
        PROJECT,
        f".run/{PROJECT}",
        BIND,
        {
            "WORKERS": "2",
            "STEPS": str(STEPS),
            "SAVE_EVERY": str(SAVE_EVERY),
            "CLUSTER_TIMEOUT": "60",
            "ARGS": "--input-delay-ms 40 --log-every 1 --heartbeat-timeout 5",
            "FAULT": f"worker-1:{kind}@{FAULT_STEP}",
            "SUPERVISE_STALL": STALL,
            **({"IMAGE_REPO": os.environ["IMAGE_REPO"]} if os.environ.get("IMAGE_REPO") else {}),
        },
    )


@pytest.fixture(params=["input-block", "hang"])
def stuck_stack(request, tmp_path_factory):
    engine_ready()
    s = stack(request.param)
    s.make("clean", "FORCE=1", timeout=300)
    up = s.make("up", timeout=1800)
    assert up.returncode == 0, f"make up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
    yield s, request.param
    # Every task's log, for a failure's post-mortem (STUCK_LOGS: a folder that outlives pytest's rotation).
    kept = Path(os.environ["STUCK_LOGS"]) / request.param if os.environ.get("STUCK_LOGS") else None
    kept = kept or tmp_path_factory.mktemp(f"stuck-{request.param}")
    kept.mkdir(parents=True, exist_ok=True)
    for service in TASKS:
        (kept / f"{service}.log").write_text("\n".join(s.logs(service)))
    print(f"\nlogs of the {request.param} run: {kept}", file=sys.stderr)
    s.make("clean", "FORCE=1", timeout=300)


def step_seconds(s: FaultStack) -> float:
    """Seconds per step the chief logged before the fault (its log's timestamps, the first call set aside)."""
    steps = [(t, n) for t, n in s.chief_steps() if n < FAULT_STEP]
    (t0, n0), (t1, n1) = steps[1], steps[-1]
    return (t1 - t0) / max(1, n1 - n0)


def wait_for_line(s: FaultStack, service: str, pattern: re.Pattern, timeout: float) -> re.Match:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = [m for m in map(pattern.match, s.logs(service)) if m]
        if found:
            return found[0]
        time.sleep(1)
    raise AssertionError(
        f"no {pattern.pattern!r} in {service}'s log within {timeout:.0f}s:\n"
        + "\n".join(s.logs(service)[-30:])
    )


def test_a_stuck_task_is_named_dumped_alerted_and_the_job_resumes(stuck_stack) -> None:
    s, kind = stuck_stack
    s.wait_for_step(FAULT_STEP - 20, timeout=600)
    per_step = step_seconds(s)
    # Reaching the fault, the frozen step, the stall bound at its ceiling, one supervisor poll.
    found = wait_for_line(s, "worker-1", STUCK_LINE, 60 * per_step + 2 * BOUND.ceiling + 30)
    stuck_step, bound = int(found[2]), int(found[4])
    frozen_at = max(t for t, n in s.chief_steps() if n <= stuck_step)
    named_at = stamp(found[1])
    code = s.wait_code(timeout=STEPS * per_step * 4 + 10 * BOUND.ceiling)
    log = s.logs("worker-1")
    text = "\n".join(log)
    assert code == 0, text[-4000:]

    # Named: worker-1's supervisor ended it as the task behind. Its peers' supervisors named it too and
    # waited; one ends its own task only as a fallback, when its collective has not failed two bounds
    # after worker-1 went away (never as the one behind, nor before worker-1 was ended).
    line = next(ln for ln in log if " supervise: stuck: " in ln)
    assert "worker-1 is behind its peers, not in the collective (input steps: worker-1 " in line, line
    for peer in ("chief", "worker-0"):
        said = [ln for ln in s.logs(peer) if " supervise: " in ln]
        named = ("worker-1 behind", "worker-1 not answering")  # not answering: already being ended
        if not any(f"step stuck at {stuck_step} " in ln and any(n in ln for n in named) for ln in said):
            # Each supervisor's bound is 20 x its own task's p99 step: a peer whose slow steps gave it a
            # longer bound than worker-1's saw its collective fail (peer lost) before that bound was up
            # (CI at load ~38: worker-0 never named worker-1). It must then have lost worker-1 only
            # after worker-1 was ended, and within the longest bound a task may have.
            lost = [ln for ln in said if "(peer lost)" in ln]
            assert lost and named_at < stamp(lost[0]) < frozen_at + BOUND.ceiling + 30, (peer, said)
        ended = [ln for ln in said if " supervise: stuck: " in ln]
        assert all("still frozen" in ln and stamp(ln) > named_at for ln in ended), (peer, said)
    # Its stack: every thread, with the frame where it blocks (trainer/core/fault.py's fire).
    dump = text[text.index(line) :]
    assert "Current thread" in dump or "Thread 0x" in dump, dump[:3000]
    assert re.search(r'trainer/core/fault\.py", line \d+ in fire', dump), dump[:3000]

    # The job resumed from its last checkpoint and finished.
    starts = s.resumes()
    assert len(starts) > 1, "\n".join(s.logs()[-20:])
    resumed_at, resumed_step = starts[-1]
    first_after = min(t for t, n in s.chief_steps() if t > resumed_at and n > resumed_step)
    assert resumed_step <= stuck_step and s.checkpoint_step() == STEPS

    # The alert fired, and `make diagnose` names worker-1 with where its stack is.
    time.sleep(6)  # one more scrape and rule evaluation
    fired = s.prom('max_over_time(ALERTS{alertname="TaskStuck", alertstate="firing"}[30m])')
    assert fired == {"worker1": 1.0}, fired
    diagnose = s.make("diagnose", timeout=120)
    said = diagnose.stdout + diagnose.stderr
    assert "stuck" in said and "worker-1" in said and f"step {stuck_step}" in said, said
    assert "make logs SERVICE=worker-1" in said, said

    taken = int(re.search(r"input steps: worker-1 (\d+)", line)[1])
    redone = taken - resumed_step
    print(
        f"\n{kind} on worker-1 at step {FAULT_STEP}: step {per_step * 1000:.0f} ms, bound {bound} s, "
        f"named {named_at - frozen_at:.1f} s after the step froze, recovery {first_after - frozen_at:.1f} s "
        f"(frozen -> first step after the resume), steps lost {stuck_step - resumed_step} "
        f"(stuck at {stuck_step}, resumed at {resumed_step}), steps run again {redone} (the hung call's "
        f"steps before the stuck batch: input step {taken} - {resumed_step}); load {open('/proc/loadavg').read().split()[:3]}",
        file=sys.stderr,
    )
