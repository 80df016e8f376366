"""Engine and host faults: the stack on a Docker engine that the test kills, restarts and "reboots".

The host's dockerd is shared and never touched: the stack (chief + 2 workers, mlp, Prometheus,
Alertmanager) runs in one Docker-in-Docker node (tests/e2e/dind.py, `mwms-engine-e2e-node-1`).
Its compose files and images are made here by `make images` (this host's engine builds them); the
images are loaded into the node's engine and the same files started there with `docker compose`;
`make wait` (python -m compose.wait) runs here against the node's engine (DOCKER_HOST).
  engine restart: SIGKILL of the node's dockerd, then dockerd again (live-restore off: the restarted
                  engine kills the containers it finds and starts them by their restart policy);
  engine stop:    SIGTERM to the node's dockerd (`systemctl stop docker`, and a `systemctl restart`'s
                  first half): it stops every container with its stop timeout and exits; then
                  dockerd again, which starts them by their restart policy;
  reboot:         `docker restart` of the node: every process in it dies at once, its engine starts
                  again from its entrypoint (a power cut and boot, as far as one machine shows it).
Recovery time = fault -> the chief's first step after the resume; steps lost = the chief's last
logged step before the resume - the step resumed from (what dockerd had not written out of a
container's log when it died is not counted).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator

import pytest

from compose.deployment import STOP_GRACE_SECONDS
from tests.e2e.conftest import engine_ready
from tests.e2e.dind import EngineNode, wait_until
from tests.e2e.faultstack import FaultStack, Outcome, Watch

pytestmark = pytest.mark.docker

NODE = EngineNode("mwms-engine-e2e", os.environ.get("ENGINE_E2E_SUBNET", "10.224.0"))
STEPS = 600
SAVE_EVERY = 50
CLUSTER_TIMEOUT_S = 60
TRAINER_ARGS = "--input-delay-ms 40 --log-every 1 --heartbeat-timeout 5"
PROJECT = "mwms-engine-e2e"
SETTINGS = {
    "WORKERS": "2",
    "STEPS": str(STEPS),
    "SAVE_EVERY": str(SAVE_EVERY),
    "CLUSTER_TIMEOUT": str(CLUSTER_TIMEOUT_S),
    "ARGS": TRAINER_ARGS,
    **({"IMAGE_REPO": os.environ["IMAGE_REPO"]} if os.environ.get("IMAGE_REPO") else {}),
}
# Made on this host's engine; Prometheus is published on the node's address, reachable from here.
BUILT = FaultStack(PROJECT, f".run/{PROJECT}", NODE.ip, SETTINGS)
MONITORING = ("prometheus", "alertmanager")


def figure(name: str, value: float) -> None:
    print(f"{name}: {value:.1f}")


@pytest.fixture(scope="module")
def node() -> Iterator[FaultStack]:
    """The node, the stack's images loaded into its engine: a FaultStack that runs in there."""
    engine_ready()
    NODE.remove()
    built = BUILT.make("images", timeout=1800)
    assert built.returncode == 0, built.stderr[-3000:]
    try:
        NODE.start()
        images = BUILT.compose("config", "--images").stdout.split()
        started = time.time()
        NODE.load(images)
        figure(f"docker save | load of {len(images)} images into the node, seconds", time.time() - started)
        yield dataclasses.replace(BUILT, docker_host=NODE.docker_host, engine_root=NODE.engine_root())
    finally:
        NODE.remove()
        BUILT.make("clean", "FORCE=1", timeout=300)


@pytest.fixture
def job(node: FaultStack) -> Iterator[FaultStack]:
    """A fresh job (no checkpoints, no history) on the node's engine."""
    node.compose("down", "--volumes", "--remove-orphans")
    up = node.compose("up", "-d", "--no-build", timeout=600)
    assert up.returncode == 0, up.stderr[-3000:]
    yield node
    node.compose("down", "--volumes", "--remove-orphans")


def step_seconds(stack: FaultStack, upto: int, timeout: float) -> float:
    """The chief's measured seconds per step, up to step `upto` (from its first logged step)."""
    stack.wait_for_step(upto, timeout)
    steps = stack.chief_steps()
    (t0, s0), (t1, s1) = steps[0], steps[-1]
    return (t1 - t0) / max(1, s1 - s0)


def strike(stack: FaultStack, fault) -> tuple[Outcome, str]:
    """Train past the first checkpoint, run `fault` (returns when the engine is back), wait for the
    job's end with `make wait` started before the fault; the outcome and what `make wait` said."""
    watch = Watch(stack)
    step_s = step_seconds(stack, SAVE_EVERY + 10, timeout=600)
    print(f"measured seconds per step: {step_s:.3f}")
    fault_at = time.time()
    at_fault = max(s for _, s in stack.chief_steps())
    assert at_fault < STEPS - SAVE_EVERY, (
        f"the job was nearly over (step {at_fault}) before the fault: raise STEPS"
    )
    fault()
    back = NODE.wait_engine(timeout=120)
    figure("fault -> the engine answers again, seconds", back - fault_at)
    # Forming the cluster again (up to its timeout, restarts included) plus the rest of the job, 3x slack.
    code = watch.code(timeout=CLUSTER_TIMEOUT_S * 3 + 3 * step_s * STEPS)
    outcome = stack.outcome(fault_at, code)
    # The log lines a killed dockerd had not written yet are gone: the step seen at the fault counts too.
    outcome.lost = max(outcome.lost, at_fault - outcome.resumed[-1])
    print(outcome)
    for service in ("chief", "worker-0", "worker-1"):  # how each task came back, for the record
        print(
            "\n".join(
                ln for ln in stack.logs(service) if "supervise:" in ln or " E " in ln or "resumed" in ln
            )
        )
    figure("fault -> the chief's first step after the resume, seconds", outcome.recovery_s)
    figure("steps lost", outcome.lost)
    return outcome, "".join(watch.lines)


def assert_recovered(stack: FaultStack, outcome: Outcome, said: str) -> None:
    assert outcome.code == 0, said + "\n".join(stack.logs()[-40:])
    assert said.strip().splitlines()[-1].startswith("wait: chief done: exit code 0"), said
    assert outcome.checkpoint == STEPS
    assert 0 <= outcome.lost <= SAVE_EVERY, outcome
    # The monitoring came back with the engine too, its history kept: the job's whole run is in Prometheus.
    for service in MONITORING:
        status = stack.inspect(service, "{{.State.Status}}")
        assert status == "running", f"{service} is {status} after the engine came back"
    seen = wait_until(
        "Prometheus to have scraped the job's last checkpoint",
        lambda: stack.prom("max_over_time(trainer_last_checkpoint_step{task_type='chief'}[15m])"),
        timeout=60,
    )
    assert seen == {"chief0": STEPS}, seen
    first = stack.prom("min_over_time(trainer_global_step{task_type='chief'}[15m])")
    assert first["chief0"] < SAVE_EVERY, f"history before the fault lost: {first}"


def test_engine_sigkilled_and_started_again_the_job_resumes_and_make_wait_returns_0(job: FaultStack) -> None:
    def restart_engine() -> None:
        NODE.kill_engine()
        NODE.start_engine()

    outcome, said = strike(job, restart_engine)
    assert_recovered(job, outcome, said)
    assert "wait: the engine is back; reading the tasks again" in said, said


def test_host_reboot_every_container_dies_at_once_the_job_resumes_and_make_wait_returns_0(
    job: FaultStack,
) -> None:
    outcome, said = strike(job, NODE.reboot)
    assert_recovered(job, outcome, said)
    assert "wait: the engine is back; reading the tasks again" in said, said


def test_engine_stopped_gracefully_and_started_again_every_task_saves_and_the_job_resumes(
    job: FaultStack,
) -> None:
    took: list[float] = []

    def stop_and_start_engine() -> None:
        # dockerd's own bound: the longest stop timeout of its containers, plus 5 s; slack for the load.
        took.append(NODE.stop_engine(timeout=3 * (STOP_GRACE_SECONDS + 5)))
        NODE.start_engine()

    outcome, said = strike(job, stop_and_start_engine)
    figure("SIGTERM to dockerd -> dockerd exited, seconds", took[0])
    assert_recovered(job, outcome, said)
    assert "wait: the engine is back; reading the tasks again" in said, said
    # Every task got SIGTERM from the stopping engine: all saved the same step, none was killed.
    assert outcome.lost == 0, outcome
