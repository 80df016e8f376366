"""Single faults on the real engine, each on its own small stack, judged from outside the trainer.

Every scenario runs a separate compose project (`mwms-faults`, its own RUN_DIR, Prometheus on
127.0.0.2; FAULTS_PROJECT, FAULTS_BIND and IMAGE_REPO override them, for a shared engine) so
the session `stack` of the other e2e tests is never touched. Here: the faults that end a job or
need a job of their own (a task that fails for good, a worker that never starts, a configuration
error, Prometheus restarted and its history across `make down`/`make up`, a SCRIPT's group
restart). The faults a job recovers from (SIGKILL of a worker, `docker kill` of a worker, of the
chief and of every task, stop then start, SIGTERM, the chief killed mid-save) strike one job in
turn, each with its own checks: tests/e2e/test_chaos.py.

Recovery time = from the fault to the chief's first step after the resume. Steps lost = the last
step the chief finished before the fault minus the step it resumed from.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e import places
from tests.e2e.conftest import ROOT, engine_ready
from tests.e2e.faultstack import FaultStack, Outcome, Watch, stamp

pytestmark = pytest.mark.docker

STEPS = 400
SAVE_EVERY = 50
HEARTBEAT_S = 5
CLUSTER_TIMEOUT_S = 20
# ~20 steps/s: a fault can land mid-run; --log-every 1: the chief logs every call's last step.
TRAINER_ARGS = f"--input-delay-ms 40 --log-every 1 --heartbeat-timeout {HEARTBEAT_S}"
PROJECT = os.environ.get("FAULTS_PROJECT", places.FAULTS.project)
STACK = FaultStack(
    PROJECT,
    f".run/{PROJECT}",
    os.environ.get("FAULTS_BIND", places.FAULTS.bind),
    {
        "WORKERS": "2",
        "STEPS": str(STEPS),
        "SAVE_EVERY": str(SAVE_EVERY),
        "CLUSTER_TIMEOUT": str(CLUSTER_TIMEOUT_S),
        "ARGS": TRAINER_ARGS,
        **({"IMAGE_REPO": os.environ["IMAGE_REPO"]} if os.environ.get("IMAGE_REPO") else {}),
    },
)
TASKS = ("chief", "worker-0", "worker-1")
STARTING_TIMEOUT_S = 120
"""The cluster timeout of the stacks whose start is not the test: on a loaded machine worker-1's
container was not even up 20 s after the chief's (`name does not resolve`, exit 3 before any fault)."""
STARTED = dataclasses.replace(STACK, settings={**STACK.settings, "CLUSTER_TIMEOUT": str(STARTING_TIMEOUT_S)})


def record(name: str, outcome: Outcome) -> None:
    """One JSON line per trial, for the worst-case table (FAULTS_RESULTS=path)."""
    path = os.environ.get("FAULTS_RESULTS")
    print(f"{name}: {outcome}")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"scenario": name, **outcome.__dict__}) + "\n")


@pytest.fixture
def fault_stack():
    """A fresh job (no checkpoints) per scenario; always torn down, history volume included."""
    engine_ready()
    STARTED.make("clean", "FORCE=1", timeout=300)
    up = STARTED.make("up", timeout=1800)
    assert up.returncode == 0, f"make up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
    yield STARTED
    STARTED.make("clean", "FORCE=1", timeout=300)


def docker(*args: str) -> None:
    subprocess.run(["docker", *args], check=True, capture_output=True, timeout=120)


def test_a_task_that_fails_for_good_mid_run_ends_every_task_within_60s(fault_stack: FaultStack) -> None:
    watch = Watch(STACK)
    fault_stack.wait_for_step(120, timeout=300)
    # Its supervisor dies (SIGKILL: the container goes, Docker's policy starts it again) and finds no
    # budget left in its kept state: final for worker-1 (exit 4, gave up), announced to its peers.
    supervisor = fault_stack.process_pid("worker-1", "python -m trainer.supervise", but="docker-init")
    os.kill(supervisor, signal.SIGSTOP)  # it rewrites its state at each new checkpoint
    state = next(
        (fault_stack.volume_dir("supervise")).glob(
            f"{fault_stack.inspect('worker-1', '{{.Config.Hostname}}')}.json"
        )
    )
    kept = json.loads(state.read_text())
    kept["budget"]["used"] = kept["budget"]["best_at_restart"] = 10**6
    kept["budget"]["best"] = 0
    state.write_text(json.dumps(kept))
    failed_at = time.time()
    os.kill(supervisor, signal.SIGKILL)
    code = watch.code(timeout=300)
    for service in TASKS:
        settled(fault_stack, service, timeout=60)
    ended = {t: stamp_of_exit(t) - failed_at for t in TASKS}
    print("ended after", ended)
    assert code == 4, "".join(watch.lines)
    assert watch.lines[-1].startswith("wait: worker-1 failed for good: exit code 4 (gave up"), watch.lines
    for service in ("chief", "worker-0"):
        last = fault_stack.logs(service)[-1]
        assert " 5 (a peer failed for good)" in last and "worker-1" in last, (service, last)
        assert ended[service] < 60, ended
    record(
        "worker-1 fails for good mid-run (peers end)",
        Outcome(
            code=code,
            checkpoint=fault_stack.checkpoint_step(),
            resumed=[],
            lost=0,
            recovery_s=round(max(ended.values()), 1),
        ),
    )


def settled(stack: FaultStack, service: str, timeout: float) -> str:
    """`exited CODE` once the task's container is down for good. Docker's `on-failure` may start a
    task that ended for good once more before `make wait` turns the policy off: its supervisor then
    exits at once with the same code (its kept state), so wait until it is down."""
    deadline = time.time() + timeout
    while (state := stack.inspect(service, "{{.State.Status}} {{.State.ExitCode}}")).split()[0] != "exited":
        assert time.time() < deadline, (service, state)
        time.sleep(0.5)
    return state


def stamp_of_exit(service: str) -> float:
    finished = STACK.inspect(service, "{{.State.FinishedAt}}")
    return stamp(finished)


def test_prometheus_restart_does_not_affect_training_and_keeps_history(fault_stack: FaultStack) -> None:
    fault_stack.wait_for_step(60, timeout=300)
    time.sleep(6)
    before = time.time()
    seen = fault_stack.prom("trainer_global_step{task_type='chief'}", at=before)
    assert seen, "Prometheus had no sample before the restart"
    restart = fault_stack.compose("restart", "prometheus")
    assert restart.returncode == 0, restart.stderr
    assert fault_stack.wait_code() == 0
    assert fault_stack.checkpoint_step() == STEPS
    assert len(fault_stack.resumes()) == 1, "training restarted"
    time.sleep(6)
    assert fault_stack.prom("trainer_global_step{task_type='chief'}", at=before) == seen, (
        "history lost in the restart"
    )
    assert fault_stack.prom("max_over_time(trainer_global_step{task_type='chief'}[10m])") == {"chief0": STEPS}
    # ... and across `make down` / `make up` (the named volume), until `make clean`.
    assert fault_stack.make("down").returncode == 0
    assert fault_stack.make("up").returncode == 0
    deadline, again = time.time() + 60, {}
    while not again and time.time() < deadline:
        try:
            again = fault_stack.prom("trainer_global_step{task_type='chief'}", at=before)
        except OSError:
            time.sleep(1)
    assert again == seen, "history lost across make down / make up"


@pytest.fixture
def generated():
    """The stack's files and images, nothing started; always torn down."""
    engine_ready()
    STACK.make("clean", "FORCE=1", timeout=300)
    built = STACK.make("images", timeout=1800)
    assert built.returncode == 0, built.stderr[-3000:]
    yield STACK
    STACK.make("clean", "FORCE=1", timeout=300)


def test_a_worker_that_never_starts_ends_every_task_with_one_line_naming_it(generated: FaultStack) -> None:
    start = time.time()
    assert generated.compose("up", "-d", "--no-build", "chief", "worker-0").returncode == 0
    code = generated.wait_code(timeout=300)
    elapsed = time.time() - start
    assert code == 3
    for service in ("chief", "worker-0"):
        errors = [ln for ln in generated.logs(service) if " E " in ln]
        assert errors and "worker-1 (worker-1:2222)" in errors[0], (service, errors)
        # A peer that never came on the first run is final: the supervisor does not retry it.
        assert not any("supervise:" in ln and ": restart " in ln for ln in generated.logs(service)), service
    print(f"missing worker: exit 3 after {elapsed:.1f}s (timeout {CLUSTER_TIMEOUT_S}s)")
    record(
        "worker never starts",
        Outcome(code=code, checkpoint=0, resumed=[], lost=0, recovery_s=round(elapsed, 1)),
    )


def test_a_configuration_error_stays_down_and_make_wait_reports_it_at_once(
    generated: FaultStack, tmp_path: Path
) -> None:
    # Only worker-1 is misconfigured; its peers wait for it (up to the cluster timeout, 120 s here).
    override = tmp_path / "bad-worker.yaml"
    override.write_text(
        "services:\n  worker-1:\n    environment:\n      TRAINER_SEED: 'not-a-number'\n"
        "  chief:\n    environment:\n      TRAINER_CLUSTER_TIMEOUT: '120'\n"
        "  worker-0:\n    environment:\n      TRAINER_CLUSTER_TIMEOUT: '120'\n"
    )
    files = (ROOT / generated.run_dir / "compose.args").read_text().split() + ["-f", str(override)]
    (ROOT / generated.run_dir / "compose.args").write_text(" ".join(files) + "\n")
    assert generated.compose("up", "-d", "--no-build").returncode == 0
    wait = generated.wait_process()
    code, err = wait.wait(timeout=300), wait.stderr.read()
    assert code == 2, err
    assert err.strip().splitlines()[-1] == (
        "wait: worker-1 failed for good: exit code 2 (bad configuration): "
        "configuration error: TRAINER_SEED='not-a-number': must be an integer"
    )
    # Its peers, waiting for it (120 s), heard of it from its supervisor and ended at once, saying why ...
    started = stamp(generated.inspect("worker-1", "{{.State.StartedAt}}"))
    for service in ("chief", "worker-0"):
        assert settled(generated, service, timeout=60) == "exited 5", service
        assert stamp(generated.inspect(service, "{{.State.FinishedAt}}")) - started < 60, service
        last = generated.logs(service)[-1]
        assert " 5 (a peer failed for good)" in last and "worker-1 (worker-1:2222) failed for good" in last
    # ... and the task stays down: the trainer ran once; Docker's policy was turned off by make wait.
    assert settled(generated, "worker-1", timeout=60) == "exited 2"
    assert generated.inspect("worker-1", "{{.HostConfig.RestartPolicy.Name}}") == "no"
    assert sum(" E configuration error" in ln for ln in generated.logs("worker-1")) == 1


SCRIPT = ROOT / "tests/scripts/fit_backup_and_restore.py"
SCRIPT_EPOCHS = 8
EPOCH_LINE = re.compile(r"^(\S+) epoch (\d+)/\d+ done")
SCRIPT_STACK = FaultStack(
    STACK.project,
    STACK.run_dir,
    STACK.bind,
    {
        "WORKERS": "2",
        "SCRIPT": str(SCRIPT),
        **({"IMAGE_REPO": os.environ["IMAGE_REPO"]} if os.environ.get("IMAGE_REPO") else {}),
    },
)


@pytest.fixture
def script_stack():
    engine_ready()
    SCRIPT_STACK.make("clean", timeout=300)
    up = SCRIPT_STACK.make("up", timeout=1800)
    assert up.returncode == 0, f"make up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
    yield SCRIPT_STACK
    SCRIPT_STACK.make("clean", timeout=300)


def epochs_done(stack: FaultStack) -> list[tuple[float, int]]:
    return [(stamp(m[1]), int(m[2])) for m in map(EPOCH_LINE.match, stack.logs("chief")) if m]


def test_a_script_with_backup_and_restore_restarts_as_a_group_and_does_every_epoch_once(
    script_stack: FaultStack,
) -> None:
    watch = Watch(STACK)
    deadline = time.time() + 300
    while not any(e >= 3 for _, e in epochs_done(script_stack)):
        assert time.time() < deadline, "\n".join(script_stack.logs("chief")[-30:])
        time.sleep(1)  # epochs take seconds; the fault lands a second into the next one anyway
    time.sleep(1)  # mid-epoch
    fault_at = time.time()
    docker("kill", script_stack.container("worker-1"))
    code = watch.code()
    done = epochs_done(script_stack)
    assert code == 0, "".join(watch.lines) + "\n".join(script_stack.logs("chief")[-30:])
    assert [e for _, e in done] == list(range(1, SCRIPT_EPOCHS + 1)), done  # every epoch, each once
    for service in ("chief", "worker-0"):  # the survivors restarted, as a group, by the supervisor
        assert any("exited 200 (peer lost): restart 1/" in ln for ln in script_stack.logs(service)), service
    before = [t for t, _ in done if t < fault_at]
    after = [t for t, _ in done if t > fault_at]
    epoch_s = (before[-1] - before[0]) / max(1, len(before) - 1)
    lost = round((fault_at - before[-1]) / epoch_s * 40)  # the unfinished epoch's batches, run again
    record(
        "SCRIPT fit + BackupAndRestore, docker kill worker-1",
        Outcome(
            code=code, checkpoint=0, resumed=[], lost=lost, recovery_s=round(after[0] - fault_at - epoch_s, 1)
        ),
    )
