"""Faults on the real engine, each on its own small stack, judged from outside the trainer.

Every scenario runs a separate compose project (`mwms-faults`, its own RUN_DIR, Prometheus on
127.0.0.2:9090) so the session `stack` of the other e2e tests is never touched. Outcomes are read
where an operator would read them: `make wait` (the chief's final exit code), the `checkpoint` file
in the chief's volume, Prometheus, and `docker logs -t` of the chief (every call logs its step, so
the last step before a fault and the step resumed from are exact).

Recovery time = from the fault to the chief's first step after the resume. Steps lost = the last
step the chief finished before the fault minus the step it resumed from.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, engine_ready

pytestmark = pytest.mark.docker

PROJECT = "mwms-faults"
RUN_DIR = ".run/faults"
BIND = "127.0.0.2"
PROM = f"http://{BIND}:9090"
STEPS = 400
SAVE_EVERY = 50
HEARTBEAT_S = 5
CLUSTER_TIMEOUT_S = 20
# ~20 steps/s: a fault can land mid-run; --log-every 1: the chief logs every call's last step.
TRAINER_ARGS = f"--input-delay-ms 40 --log-every 1 --heartbeat-timeout {HEARTBEAT_S}"
VARS = [f"PROJECT={PROJECT}", f"RUN_DIR={RUN_DIR}", f"BIND_ADDR={BIND}", "WORKERS=2", "OFFLINE=1", "GPUS=0",
        f"STEPS={STEPS}", f"SAVE_EVERY={SAVE_EVERY}", f"CLUSTER_TIMEOUT={CLUSTER_TIMEOUT_S}"]
STEP_LINE = re.compile(r"^(\S+) .* chief \| step (\d+)/")
RESUMED = re.compile(r"^(\S+) .*chief: resumed at step (\d+)")


def make(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args, *VARS], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def compose(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    files = (ROOT / RUN_DIR / "compose.args").read_text().split()
    return subprocess.run(["docker", "compose", "--project-directory", str(ROOT), "--env-file",
                           str(ROOT / RUN_DIR / "stack.env"), *files, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def wait_code(timeout: float = 600) -> int:
    """The chief's final exit code, as `make wait` reports it (make itself turns any failure into 2)."""
    return subprocess.run([sys.executable, "-m", "compose.wait", PROJECT], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout).returncode


def container(service: str) -> str:
    return f"{PROJECT}-{service}-1"


def inspect(service: str, fmt: str) -> str:
    return subprocess.run(["docker", "inspect", "-f", fmt, container(service)], capture_output=True, text=True,
                          check=True).stdout.strip()


def logs(service: str = "chief") -> list[str]:
    out = subprocess.run(["docker", "logs", "-t", container(service)], capture_output=True, text=True)
    return (out.stdout + out.stderr).splitlines()


def stamp(text: str) -> float:
    return datetime.fromisoformat(text[:26].rstrip("Z") + "+00:00").timestamp()


def chief_steps() -> list[tuple[float, int]]:
    return [(stamp(m[1]), int(m[2])) for m in map(STEP_LINE.match, logs()) if m]


def wait_for_step(step: int, timeout: float = 240) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(s >= step for _, s in chief_steps()):
            return time.time()
        time.sleep(0.2)
    raise AssertionError(f"the chief never reached step {step}:\n" + "\n".join(logs()[-30:]))


def checkpoint_step() -> int:
    mount = subprocess.run(["docker", "volume", "inspect", "-f", "{{.Mountpoint}}", f"{PROJECT}_checkpoints"],
                           capture_output=True, text=True, check=True).stdout.strip()
    state = (Path(mount) / "checkpoint").read_text()
    return int(re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', state, re.M)[1])


def prom(expr: str, at: float | None = None) -> dict[str, float]:
    params = {"query": expr} | ({"time": f"{at:.3f}"} if at else {})
    with urllib.request.urlopen(f"{PROM}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=5) as r:
        result = json.load(r)["data"]["result"]
    return {s["metric"].get("task_type", "") + s["metric"].get("task_index", ""): float(s["value"][1])
            for s in result}


@dataclass
class Outcome:
    code: int
    checkpoint: int
    resumed: list[int]
    lost: int
    recovery_s: float


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
    make("clean", timeout=300)
    up = make("up", f"ARGS={TRAINER_ARGS}", timeout=1800)
    assert up.returncode == 0, f"make up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
    yield
    make("clean", timeout=300)


def finish(fault_at: float) -> Outcome:
    """Wait for the job to end; what happened, seen from outside."""
    code = wait_code()
    lines = logs()
    resumed = [(stamp(m[1]), int(m[2])) for m in map(RESUMED.match, lines) if m]
    steps = chief_steps()
    state = inspect("chief", "{{json .State}} restarts={{.RestartCount}}")
    assert resumed, f"the chief never resumed (wait: {code}; {state}):\n" + "\n".join(lines[-15:])
    resumed_at, resumed_step = resumed[-1]
    before = max((s for t, s in steps if t < resumed_at), default=0)  # the old incarnation's last step
    first_after = min((t for t, s in steps if t > resumed_at and s > resumed_step), default=float("nan"))
    return Outcome(code=code, checkpoint=checkpoint_step(), resumed=[s for _, s in resumed],
                   lost=max(0, before - resumed_step), recovery_s=round(first_after - fault_at, 1))


def assert_completed(outcome: Outcome) -> None:
    assert outcome.code == 0, f"chief exit code {outcome.code}:\n" + "\n".join(logs()[-40:])
    assert outcome.checkpoint == STEPS
    time.sleep(6)  # one more scrape interval
    assert prom(f"max_over_time(trainer_last_checkpoint_step{{task_type='chief'}}[10m])") == {"chief0": STEPS}
    # The last incarnation ran exactly the steps after its resume: the job finished, none twice.
    ran = prom("last_over_time(trainer_steps_total[10m])")
    assert set(ran) == {"chief0", "worker0", "worker1"}, ran
    assert all(v == STEPS - outcome.resumed[-1] for v in ran.values()), (ran, outcome)


def test_sigkill_worker_resumes_from_checkpoint_and_completes(fault_stack) -> None:
    wait_for_step(120)
    pid = inspect("worker-1", "{{.State.Pid}}")
    fault_at = time.time()
    os.kill(int(pid), 9)  # a crash, not `docker kill`: Docker applies the restart policy
    outcome = finish(fault_at)
    record("SIGKILL worker-1", outcome)
    assert_completed(outcome)
    assert outcome.lost <= SAVE_EVERY
    assert outcome.recovery_s < 120


def test_sigterm_worker_saves_everywhere_and_loses_no_step(fault_stack) -> None:
    wait_for_step(120)
    fault_at = time.time()
    restart = compose("restart", "worker-1")  # docker stop (SIGTERM) then start: a preemption
    assert restart.returncode == 0, restart.stderr
    outcome = finish(fault_at)
    record("SIGTERM worker-1 (compose restart)", outcome)
    assert_completed(outcome)
    assert outcome.lost == 0
    for service in ("chief", "worker-0"):  # the others saved too, and said why they exited
        assert any("preempted" in ln for ln in logs(service)), service


def test_sigkill_chief_during_a_save_restores_the_last_complete_checkpoint(fault_stack) -> None:
    mount = Path(subprocess.run(["docker", "volume", "inspect", "-f", "{{.Mountpoint}}", f"{PROJECT}_checkpoints"],
                                capture_output=True, text=True, check=True).stdout.strip())
    wait_for_step(SAVE_EVERY + 1)
    pid = int(inspect("chief", "{{.State.Pid}}"))
    caught, deadline = None, time.time() + 60
    while caught is None and time.time() < deadline:  # a save in flight: TensorFlow's temporary files
        names = os.listdir(mount)
        if any("_temp" in n or ".tmp" in n for n in names):
            os.kill(pid, 9)
            caught = names
    fault_at = time.time()
    if caught is None:
        os.kill(pid, 9)
    print("killed the chief with", caught)
    outcome = finish(fault_at)
    record("SIGKILL chief during save" + ("" if caught else " (missed the save)"), outcome)
    assert_completed(outcome)
    assert outcome.lost <= SAVE_EVERY
    assert caught is not None, "no save was in flight within 60 s"


def test_prometheus_restart_does_not_affect_training_and_keeps_history(fault_stack) -> None:
    wait_for_step(60)
    time.sleep(6)
    before = time.time()
    seen = prom("trainer_global_step{task_type='chief'}", at=before)
    assert seen, "Prometheus had no sample before the restart"
    restart = compose("restart", "prometheus")
    assert restart.returncode == 0, restart.stderr
    assert wait_code() == 0
    assert checkpoint_step() == STEPS
    assert not any(RESUMED.match(ln) for ln in logs()), "training restarted"
    assert inspect("chief", "{{.RestartCount}}") == "0"
    time.sleep(6)
    assert prom("trainer_global_step{task_type='chief'}", at=before) == seen, "history lost in the restart"
    assert prom("max_over_time(trainer_global_step{task_type='chief'}[10m])") == {"chief0": STEPS}
    # ... and across `make down` / `make up` (the named volume), until `make clean`.
    assert make("down").returncode == 0
    assert make("up", f"ARGS={TRAINER_ARGS}").returncode == 0
    deadline, again = time.time() + 60, {}
    while not again and time.time() < deadline:
        try:
            again = prom("trainer_global_step{task_type='chief'}", at=before)
        except OSError:
            time.sleep(1)
    assert again == seen, "history lost across make down / make up"


def test_a_worker_that_never_starts_ends_every_task_with_one_line_naming_it() -> None:
    engine_ready()
    make("clean", timeout=300)
    try:
        built = make("images", f"ARGS={TRAINER_ARGS}", timeout=1800)  # generates the files, starts nothing
        assert built.returncode == 0, built.stderr[-3000:]
        start = time.time()
        assert compose("up", "-d", "--no-build", "chief", "worker-0").returncode == 0
        code = wait_code(timeout=300)
        elapsed = time.time() - start
        assert code == 3
        for service in ("chief", "worker-0"):
            errors = [ln for ln in logs(service) if " E " in ln]
            assert errors and "worker-1 (worker-1:2222)" in errors[0], (service, errors)
            assert len(errors[0].split("\n")) == 1
        print(f"missing worker: exit 3 after {elapsed:.1f}s (timeout {CLUSTER_TIMEOUT_S}s)")
        record("worker never starts", Outcome(code=code, checkpoint=0, resumed=[], lost=0,
                                               recovery_s=round(elapsed, 1)))
        assert elapsed < CLUSTER_TIMEOUT_S + 30
    finally:
        make("clean", timeout=300)
