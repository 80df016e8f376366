"""`make wait`: when the job is over, and what it says. The real engine is in tests/e2e/test_faults.py."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence

import pytest

from compose import wait

RUNNING = ("running", 0)


@pytest.mark.parametrize(
    ("states", "over"),
    [
        ({"chief": RUNNING, "worker-0": RUNNING}, None),
        ({"chief": ("exited", 0), "worker-0": ("exited", 0)}, (0, "chief")),
        ({"chief": ("exited", 0), "worker-0": RUNNING}, (0, "chief")),
        ({"chief": RUNNING, "worker-0": ("exited", 0)}, None),  # the chief is still saving
        ({"chief": RUNNING, "worker-1": ("exited", 2)}, (2, "worker-1")),  # final: reported at once
        ({"chief": ("exited", 3), "worker-0": ("exited", 4)}, (3, "chief")),  # the chief first
        ({"chief": RUNNING, "worker-1": ("exited", 201)}, None),  # docker stop / restart: may come back
        ({"chief": RUNNING, "worker-1": ("exited", 137)}, None),
        ({"chief": ("exited", 201), "worker-0": ("exited", 201)}, (201, "chief")),  # everything stopped
        ({"chief": ("removed", 137), "worker-0": ("removed", 0)}, (137, "chief")),
        # 5 echoes a peer's final exit: the task that failed first is named, once it is down too.
        ({"chief": ("exited", 5), "worker-1": ("exited", 2)}, (2, "worker-1")),
        ({"chief": ("exited", 5), "worker-1": RUNNING}, None),  # worker-1 is still telling its peers
        ({"chief": ("exited", 5), "worker-1": ("exited", 5)}, (5, "chief")),
    ],
)
def test_judge(states: dict, over: tuple[int, str] | None) -> None:
    got = wait.judge(states)
    assert (got and (got.code, got.service)) == over


class FakeDocker:
    """ps/inspect/logs answers for a project of a chief, worker-0 and Prometheus."""

    def __init__(self, logs: dict[str, str], states: dict[str, str]) -> None:
        self.logs, self.states = logs, states
        self.calls: list[tuple[str, ...]] = []
        self.engine = True
        """The engine answers (a stopping one has closed its API)."""

    def __call__(self, cmd: Sequence[str]) -> str:
        if cmd[0] == "info" and not self.engine:
            raise subprocess.CalledProcessError(1, ["docker", *cmd])
        if cmd[0] in ("start", "update"):
            self.calls.append(tuple(cmd))
            return ""
        if cmd[0] == "ps":
            return "\n".join(f"id-{s} {s}" for s in [*self.states, "prometheus"])
        if cmd[0] == "inspect" and "RestartPolicy" in cmd[2]:
            return "no" if ("update", "--restart", "no", cmd[-1]) in self.calls else "on-failure"
        if cmd[0] == "inspect":
            return self.states[cmd[-1].removeprefix("id-")]
        return self.logs.get(cmd[-1].removeprefix("id-"), "")


def die(service: str, code: int) -> dict:
    return {
        "Action": "die",
        "id": f"id-{service}",
        "Actor": {"Attributes": {"exitCode": str(code), wait.SERVICE: service}},
    }


def start(service: str) -> dict:
    return {"Action": "start", "id": f"id-{service}", "Actor": {"Attributes": {wait.SERVICE: service}}}


def kill(service: str, signum: int) -> dict:
    return {
        "Action": "kill",
        "id": f"id-{service}",
        "Actor": {"Attributes": {"signal": str(signum), wait.SERVICE: service}},
    }


def run_watch(
    events: Iterable[dict], logs: dict[str, str] | None = None, docker: FakeDocker | None = None
) -> tuple[int, list[str]]:
    job = wait.Job("p", run=docker or FakeDocker(logs or {}, {"chief": "running 0", "worker-0": "running 0"}))
    job.read()
    lines: list[str] = []
    return wait.watch(job, events, log=lines.append), lines


def test_a_task_killed_with_docker_kill_is_started_again_but_a_stopped_one_is_not() -> None:
    docker = FakeDocker({}, {"chief": "running 0", "worker-0": "running 0"})
    events = [
        kill("worker-0", 9),  # docker kill: Docker's restart policy counts it as a manual stop
        die("worker-0", 137),
        start("worker-0"),
        kill("worker-0", 15),  # docker stop, then its SIGKILL after the grace period: the operator's
        kill("worker-0", 9),
        die("worker-0", 137),
        die("chief", 0),
    ]
    code, lines = run_watch(events, docker=docker)
    assert code == 0
    assert lines[0] == "wait: worker-0 was killed (137, killed by SIGKILL; docker kill): started it again"
    assert "stopped or killed from outside" in lines[1]
    # Started once; when the job is over no task is restarted by Docker's policy either.
    assert docker.calls == [
        ("start", "id-worker-0"),
        ("update", "--restart", "no", "id-chief"),
        ("update", "--restart", "no", "id-worker-0"),
    ]


def test_a_configuration_error_is_reported_at_once_with_the_tasks_error_line() -> None:
    worker_log = (
        "2026-01-01 12:00:00,000 I starting\n"
        "2026-01-01 12:00:00,100 E configuration error: --steps (TRAINER_STEPS): must be 1 or more\n"
        "supervise: exited 2 (bad configuration): final, not restarting"
    )
    code, lines = run_watch([die("worker-0", 2), die("chief", 0)], logs={"worker-0": worker_log})
    assert code == 2
    assert lines == [
        "wait: worker-0 failed for good: exit code 2 (bad configuration): "
        "configuration error: --steps (TRAINER_STEPS): must be 1 or more"
    ]


def test_a_restarted_container_is_not_the_end_and_done_counts_the_trainers_restarts() -> None:
    chief_log = (
        "supervise: exited 200 (peer lost): restart 1/3 since the last new checkpoint (step 100)\n" * 2
    )
    code, lines = run_watch(
        [die("worker-0", 201), start("worker-0"), die("chief", 0)], logs={"chief": chief_log}
    )
    assert code == 0
    assert "worker-0 exited 201 (preempted): stopped or killed from outside" in lines[0]
    assert lines[-1] == "wait: chief done: exit code 0 after 2 restart(s) of the trainer"


def test_a_script_without_the_trainers_log_format_reports_its_last_line() -> None:
    log = "Traceback (most recent call last):\nValueError: no such file\nsupervise: exited 1 (permanent failure)"
    assert run_watch([die("chief", 1)], logs={"chief": log}) == (
        1,
        ["wait: chief failed for good: exit code 1 (permanent failure): ValueError: no such file"],
    )


def test_removed_containers_end_the_wait() -> None:
    code, lines = run_watch(
        [
            {"Action": "destroy", "id": "id-chief", "Actor": {"Attributes": {wait.SERVICE: "chief"}}},
            {"Action": "destroy", "id": "id-worker-0", "Actor": {"Attributes": {wait.SERVICE: "worker-0"}}},
        ]
    )
    assert code == 125  # removed while running: no exit code of its own
    assert lines[0] == "wait: chief's container was removed (make down?)"
    assert "stopped with every task" in lines[-1]


def test_every_task_stopped_by_a_stopping_engine_is_not_the_end_but_by_the_operator_it_is() -> None:
    # SIGTERM to dockerd: it closes its API, then stops every container (their exits still stream),
    # then exits; it starts them again by their policy. Found by tests/e2e/test_engine_faults.py:
    # `make wait` returned 201 ("stopped with every task") while the job was resuming.
    docker = FakeDocker({}, {"chief": "running 0", "worker-0": "running 0"})
    docker.engine = False
    stopped = [kill("chief", 15), kill("worker-0", 15), die("chief", 201), die("worker-0", 201)]
    code, lines = run_watch(stopped, docker=docker)
    assert code is None, lines
    assert "wait: every task was stopped by the engine, which is stopping; waiting for it" in lines, lines
    assert run_watch(stopped)[0] == 201  # `docker compose stop`: the engine answers


def test_returns_at_the_deciding_event_without_waiting_for_more() -> None:
    def stream():  # `docker events` never ends by itself
        yield die("chief", 0)
        raise AssertionError("read past the event that ended the job")

    assert run_watch(stream())[0] == 0


def test_events_that_end_early_are_not_the_end() -> None:
    code, lines = run_watch([])
    assert code is None and lines == ["wait: docker events ended before the job did"]


def test_every_task_killed_at_once_is_started_again_not_the_end() -> None:
    docker = FakeDocker({}, {"chief": "running 0", "worker-0": "running 0"})
    events = [kill("chief", 9), kill("worker-0", 9), die("chief", 137), die("worker-0", 137)]
    events += [start("chief"), start("worker-0"), die("worker-0", 0), die("chief", 0)]
    code, lines = run_watch(events, docker=docker)
    assert code == 0, lines
    assert [c for c in docker.calls if c[0] == "start"] == [("start", "id-chief"), ("start", "id-worker-0")]


class FakeEvents:
    """`docker events` as main() starts it: each start streams the next list (the engine's lifetimes)."""

    def __init__(self, streams: list[list[dict]]) -> None:
        self.streams = iter(streams)

    def __call__(self, project: str):
        return self, iter(next(self.streams))

    def kill(self) -> None:
        pass

    def wait(self) -> int:
        return 0


def test_an_engine_that_restarts_before_wait_looks_is_read_again_not_the_end(monkeypatch) -> None:
    # The events stream ends with the engine; by the time `make wait` asks, the engine already answers
    # again: the job is still on (its tasks restarted by their policy), so wait reads them and goes on.
    docker = FakeDocker({}, {"chief": "running 0", "worker-0": "running 0"})
    job = wait.Job
    monkeypatch.setattr(wait, "Job", lambda project: job(project, run=docker))
    monkeypatch.setattr(wait, "docker_events", FakeEvents([[die("chief", 137)], [die("chief", 0)]]))
    monkeypatch.setattr(wait, "engine_up", lambda: True)
    monkeypatch.setattr(wait, "ENGINE_RETRY_S", 0)
    assert wait.main(["p"]) == 0


def test_a_task_killed_before_wait_started_is_started_again() -> None:
    """Issue 29: `docker kill` of worker-0 with no `make wait` running, then `make wait`: it started nothing."""
    docker = FakeDocker({}, {"chief": "running 0", "worker-0": "exited 137", "worker-1": "running 0"})
    job = wait.Job("p", run=docker)
    job.read()
    assert job.revive() == [
        "worker-0 was killed (137, killed by SIGKILL; before this wait started): started it again"
    ]
    assert docker.calls == [("start", "id-worker-0")]
    for states in (
        {"chief": "exited 0", "worker-0": "exited 137"},  # the job is done: nothing to start
        {"chief": "exited 137", "worker-0": "exited 137"},  # every task down: make up's, not ours
        {"chief": "running 0", "worker-0": "exited 143"},  # docker stop (SIGTERM): the operator's
    ):
        docker = FakeDocker({}, states)
        job = wait.Job("p", run=docker)
        job.read()
        assert job.revive() == [] and docker.calls == [], states


def test_settle_reads_the_policy_back_and_updates_again_until_it_is_no() -> None:
    """CI, load ~30: `make wait` said worker-1 failed for good, and its container kept `on-failure`: an
    update that meets the task's exit (Docker's policy had just started it again) fails and the engine
    puts the old policy back."""
    policy = {"c1": "on-failure", "c2": "on-failure"}
    refused = {"c2": 2}  # c2's first two updates meet its exit: refused, the old policy kept
    calls: list[tuple[str, ...]] = []

    def run(cmd: Sequence[str]) -> str:
        calls.append(tuple(cmd))
        cid = cmd[-1]
        if cmd[0] == "update":
            if refused.get(cid, 0):
                refused[cid] -= 1
                raise subprocess.CalledProcessError(1, ["docker", *cmd])
            policy[cid] = "no"
            return cid
        return policy[cid] + "\n"

    job = wait.Job("p", run)
    job.containers = {"chief": "c1", "worker-0": "c2"}
    job.settle(sleep=lambda s: None)
    assert policy == {"c1": "no", "c2": "no"}
    assert sum(c[0] == "update" and c[-1] == "c2" for c in calls) == 3
