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
The three strike one job in turn (each after a new checkpoint; once separate jobs, merged: the same
checks, per fault). Recovery time = fault -> the chief's first step after the resume; steps lost =
the chief's last logged step before the resume - the step resumed from, or the step seen at the
fault if higher (what dockerd had not written out of a container's log when it died is gone).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator

import pytest

from tests.e2e import places
from tests.e2e.conftest import engine_ready
from tests.e2e.dind import EngineNode, wait_until
from tests.e2e.faultstack import FaultStack, Watch, stamp
from tests.e2e.test_chaos import Chaos, Fault

pytestmark = [pytest.mark.docker, pytest.mark.dind]

NODE = EngineNode(places.ENGINE_NODE.name, os.environ.get("ENGINE_E2E_SUBNET", places.ENGINE_NODE.subnet))
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


FAULTS = ("engine-sigkill", "host-reboot", "engine-stop")
"""In turn on one job, each after a new checkpoint (tests/e2e/test_chaos.py's engine faults):
SIGKILL of dockerd then dockerd again; `docker restart` of the node; SIGTERM to dockerd then dockerd."""


def test_engine_killed_host_rebooted_engine_stopped_the_job_resumes_each_time_and_make_wait_returns_0(
    job: FaultStack,
) -> None:
    faults = [Fault(kind, "every-task", SAVE_EVERY + 10) for kind in FAULTS]
    chaos = Chaos(job, faults, NODE)
    chaos.steps = STEPS
    watch = Watch(job)
    chaos.measure(started=stamp(job.inspect("chief", "{{.State.StartedAt}}")))
    results = []
    for index, fault in enumerate(faults, 1):
        results.append(result := chaos.run_one(index, fault, watch.proc))
        figure(f"{fault.kind}: fault -> the chief's first step after the resume, seconds", result.recovery_s)
        figure(f"{fault.kind}: steps lost", result.lost)
        # The monitoring came back with the engine each time.
        for service in MONITORING:
            status = job.inspect(service, "{{.State.Status}}")
            assert status == "running", f"{service} is {status} after {fault.kind}"
    code = watch.code(timeout=chaos.steps_timeout(STEPS) + chaos.recovery_timeout())
    said = "".join(watch.lines)
    for service in ("chief", "worker-0", "worker-1"):  # how each task came back, for the record
        print(
            "\n".join(ln for ln in job.logs(service) if "supervise:" in ln or " E " in ln or "resumed" in ln)
        )
    assert code == 0, said + "\n".join(job.logs()[-40:])
    assert said.strip().splitlines()[-1].startswith("wait: chief done: exit code 0"), said
    assert said.count("wait: the engine is back; reading the tasks again") >= len(FAULTS), said
    assert job.checkpoint_step() == STEPS
    for r in results:
        # A stopping engine sends every task SIGTERM: all save the same step, none is killed.
        limit = 0 if r.kind == "engine-stop" else SAVE_EVERY
        assert 0 <= r.lost <= limit, r
    # Prometheus's history is kept across all three: the job's whole run is in it.
    seen = wait_until(
        "Prometheus to have scraped the job's last checkpoint",
        lambda: (
            job.prom("max_over_time(trainer_last_checkpoint_step{task_type='chief'}[1h])")
            == {"chief0": STEPS}
        ),
        timeout=60,
    )
    assert seen
    first = job.prom("min_over_time(trainer_global_step{task_type='chief'}[1h])")
    assert first["chief0"] < SAVE_EVERY, f"history before the faults lost: {first}"
