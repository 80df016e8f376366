"""Runs never mix, on real stacks (issue 21): a run, `make down`, `make up` of another build on the same
project, then `make diagnose`; and two stacks on one engine, each seeing only its own tasks.

The first run trains another task (its build info differs, as a SCRIPT= run's did); its series are
still in Prometheus' lookback when the second run is judged, which said `cluster: MISMATCH` before
every series carried the run. Own projects and addresses (RUNS_BIND_A / RUNS_BIND_B, defaults
in tests/e2e/places.py); IMAGE_REPO is honoured.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.e2e import places
from tests.e2e.conftest import engine_ready
from tests.e2e.faultstack import FaultStack

pytestmark = pytest.mark.docker

SETTINGS = {"WORKERS": "2", "SAVE_EVERY": "0", "IMAGE_REPO": os.environ.get("IMAGE_REPO", "mwms/trainer")}
A = FaultStack(
    places.RUNS_A.project,
    f".run/{places.RUNS_A.project}",
    os.environ.get("RUNS_BIND_A", places.RUNS_A.bind),
    SETTINGS,
)
B = FaultStack(
    places.RUNS_B.project,
    f".run/{places.RUNS_B.project}",
    os.environ.get("RUNS_BIND_B", places.RUNS_B.bind),
    SETTINGS,
)
TASKS = ["chief", "worker-0", "worker-1"]
RUN_DELAY_MS = "100"
"""The two mlp runs' input delay: 10 steps a second, a rate for `make status` and diagnose's windows."""


def up(stack: FaultStack, **settings: str) -> None:
    result = FaultStack(stack.project, stack.run_dir, stack.bind, {**stack.settings, **settings}).make(
        "up", timeout=1200
    )
    assert result.returncode == 0, result.stdout + result.stderr


def status(stack: FaultStack, prometheus: str | None = None) -> list[list[str]]:
    args = ["status"] + ([f"PROMETHEUS_URL={prometheus}"] if prometheus else [])
    result = stack.make(*args, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    return [r for r in rows if r and r[0] != "job:"]  # the task rows, not the job's summary line


def diagnose(stack: FaultStack) -> dict:
    result = stack.make("diagnose", "JSON=1", timeout=120)
    return json.loads(result.stdout)


def until(check, timeout: float):
    deadline = time.time() + timeout
    while True:
        if (got := check()) or time.time() > deadline:
            return got
        time.sleep(5)


def _forget_checkpoints(stack: FaultStack) -> None:
    volume = f"{stack.project}_checkpoints"
    gone = subprocess.run(["docker", "volume", "rm", volume], capture_output=True, text=True)
    assert gone.returncode == 0, gone.stderr


@pytest.fixture(scope="module")
def stacks():
    engine_ready()
    try:
        # The earlier run: another build (task cnn), its steps slowed by input (200 ms) so that its tasks
        # do not take the cores of the modules beside this one while the verdict's windows fill.
        up(A, TASK="cnn", STEPS="100000000", INPUT_DELAY_MS="200")
        until(lambda: diagnose(A)["verdict"] not in ("no-data",), timeout=300)
        assert A.make("down").returncode == 0
        # Another model cannot resume the first run's checkpoint (make up refuses it): start that
        # over, keeping the Prometheus history whose series must not mix with the new run's.
        _forget_checkpoints(A)
        # Both then run for the module's length: an input delay keeps their six tasks from taking the
        # cores the modules beside this one need (what is judged here is whose series is whose). At 25 ms
        # (40 steps a second) each task took ~0.23 of a core (5.8 CPU-ms a step, a paced mlp job's), the
        # six ~1.4 of the 2 cores the side-by-side stage is bound by; at 100 ms a quarter of that.
        up(A, TASK="mlp", STEPS="100000000", INPUT_DELAY_MS=RUN_DELAY_MS)  # a new run of the same project
        up(B, TASK="mlp", STEPS="100000000", INPUT_DELAY_MS=RUN_DELAY_MS)
        yield
    finally:
        for s in (A, B):
            s.make("clean", timeout=300)


def test_the_new_run_is_judged_on_its_own_series(stacks):
    def judged() -> dict | None:
        """A verdict over every task of the new run (while it starts, some are not scraped yet)."""
        d = diagnose(A)
        return d if sorted(d["tasks"]) == sorted(TASKS) and d["verdict"] not in ("no-data", "down") else None

    report = until(judged, timeout=400)
    assert report, f"no verdict over every task: {diagnose(A)}"
    assert report["verdict"] != "mismatch", report
    assert sorted(report["tasks"]) == sorted(TASKS), report


def test_two_stacks_each_see_only_their_own_tasks(stacks):
    for stack in (A, B):
        rows = until(lambda s=stack: (r := status(s)) and all(x[2] != "-" for x in r) and r, timeout=300)
        assert rows and [r[0] for r in rows] == TASKS, rows
    # B's tasks against A's Prometheus: nothing of A's is B's.
    crossed = status(B, prometheus=A.prometheus)
    assert [r[0] for r in crossed] == TASKS
    assert all(cell == "-" for r in crossed for cell in r[2:]), crossed
