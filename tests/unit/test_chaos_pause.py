"""make chaos's pause-worker fault on a loaded machine: runc's "unable to freeze" is tried again, any
other failure is not (tests/e2e/test_chaos.py pause)."""

import subprocess

import pytest

from monitoring.tune.job import PAUSE_WAITS
from tests.e2e import test_chaos as chaos

FROZE = "Error response from daemon: Cannot pause container c: OCI runtime pause failed: unable to freeze: unknown"


def _docker(failures: list[str]):
    calls = []

    def run(args, **_):
        calls.append(args)
        stderr = failures.pop(0) if failures else ""
        return subprocess.CompletedProcess(args, 1 if stderr else 0, "", stderr)

    return run, calls


def test_a_worker_that_does_not_freeze_at_once_is_paused_on_a_later_try():
    run, calls = _docker([FROZE, FROZE])
    waits = []
    chaos.pause("w0", run=run, sleep=waits.append)
    assert calls == [["docker", "pause", "w0"]] * 3 and waits == list(PAUSE_WAITS[:2])


def test_other_failures_and_a_worker_that_never_freezes_fail_with_docker_s_line():
    run, _ = _docker(["Error: No such container: w0"])
    with pytest.raises(AssertionError, match="No such container"):
        chaos.pause("w0", run=run, sleep=lambda _: None)
    run, calls = _docker([FROZE] * (len(PAUSE_WAITS) + 1))
    with pytest.raises(AssertionError, match="unable to freeze"):
        chaos.pause("w0", run=run, sleep=lambda _: None)
    assert len(calls) == len(PAUSE_WAITS) + 1
