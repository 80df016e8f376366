"""`make wait`: the chief's final exit code across Docker's automatic restarts."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import pytest

from compose import wait


def fake_docker(exits: list[tuple[int, str]]) -> wait.Runner:
    """Each `docker wait` returns the next exit; the following inspect shows the state Docker chose."""
    events = iter(exits)
    current: list[tuple[int, str]] = []

    def run(cmd: Sequence[str]) -> str:
        if cmd[0] == "wait":
            current[:] = [next(events)]
            return str(current[0][0])
        return f"{current[0][1]} {len(exits)}"
    return run


@pytest.mark.parametrize(("exits", "final"), [
    ([(0, "exited")], 0),
    ([(200, "restarting"), (200, "restarting"), (0, "exited")], 0),
    ([(200, "restarting"), (2, "restarting")], 2),       # permanent: Docker's retry cannot help
    ([(200, "restarting"), (200, "exited")], 200),       # restart budget spent
    ([(137, "restarting"), (143, "exited")], 143),
])
def test_final_exit_code(exits: list[tuple[int, str]], final: int) -> None:
    assert wait.wait("chief", run=fake_docker(exits), log=lambda _m: None) == final


def test_container_removed_mid_wait_returns_last_code() -> None:
    calls = iter(["200", "restarting 1"])

    def run(cmd: Sequence[str]) -> str:
        try:
            return next(calls)
        except StopIteration:
            raise subprocess.CalledProcessError(1, cmd) from None
    assert wait.wait("chief", run=run, log=lambda _m: None) == 200
