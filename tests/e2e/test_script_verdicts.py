"""`make diagnose` says why a team's OWN script is slow (issues 17 and 21), on real stacks.

Scripts written as users write them (tests/e2e/scripts/, nothing of this project imported) run under
`make up SCRIPT=...` with the sampled split turned on (TRAINER_SPLIT_PERIOD_S, at the recommended
period: it is off by default, docs/script.md says why), on one project of their own (VERDICTS_PROJECT,
VERDICTS_BIND; IMAGE_REPO honoured), one run after another:

1. a `model.fit` CNN script; its healthy step, worker-0's CPU use and bytes per step are measured;
   then `docker update --cpus` starves worker-0 -> STRAGGLER naming worker-0;
2. `make down`, then a custom-loop script on the same project with worker-1's link rate-limited by
   `tc` in its network namespace -> COMMUNICATION-BOUND on every task, judged on this run's series
   only (issue 21: the previous run's build must not make it a MISMATCH);
3. `make down`, then the fit script with a slow decode map in its tf.data pipeline -> INPUT-BOUND.

Every fault is sized from what the same run measured (FAULT_FACTOR healthy steps per step), every
wait from the sampling period and Prometheus' 1 minute windows, never from the machine being idle.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from contract import ALLREDUCE_BYTES, SPLIT_SAMPLES, STEP, STEPS
from tests.e2e.conftest import ROOT, engine_ready
from tests.e2e.faultstack import FaultStack

pytestmark = pytest.mark.docker

SCRIPTS = ROOT / "tests" / "e2e" / "scripts"
SPLIT_PERIOD_S = 30
"""docs/script.md's recommended period (trainer.observe.config.RECOMMENDED_PERIOD_S)."""
RULE_WINDOW_S = 60
"""The `task:…1m` recording rules diagnose reads."""
VERDICT_TIMEOUT_S = RULE_WINDOW_S + 2 * SPLIT_PERIOD_S + 60
"""After a fault: the next window samples it, then the 1 minute window fills with it (plus slack
for one restart of every task, should the profiler's stop crash a worker: docs/script.md)."""
FIRST_SPLIT_TIMEOUT_S = 420
"""make up, TensorFlow's start-up and the cluster forming on a loaded machine, then the first window."""
MEASURE_WINDOW = "30s"
FAULT_FACTOR = 4
"""Each fault costs this many healthy steps per step: far past every threshold (20 % input wait,
50 % all-reduce, 1.5x the others' compute), whatever the load made the healthy step."""
TASKS = ("chief", "worker-0", "worker-1")
STACK = FaultStack(
    os.environ.get("VERDICTS_PROJECT", "verdicts"),
    f".run/{os.environ.get('VERDICTS_PROJECT', 'verdicts')}",
    os.environ.get("VERDICTS_BIND", "127.0.0.23"),
    {
        "WORKERS": "2",
        "IMAGE_REPO": os.environ.get("IMAGE_REPO", "mwms/trainer"),
        "TRAINER_SPLIT_PERIOD_S": str(SPLIT_PERIOD_S),
    },
)


@dataclass(frozen=True)
class Healthy:
    """What a run measured before its fault."""

    verdict: str
    step_s: float
    """Slowest task's mean step, seconds."""
    bytes_per_step: float
    worker0_cores: float


def sh(*cmd: str, check: bool = True) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert not check or result.returncode == 0, f"{' '.join(cmd)}: {result.stdout}{result.stderr}"
    return result.stdout.strip()


def up(script: str, args: str = "") -> FaultStack:
    """`make up SCRIPT=...` on this project; returns when every task has exported a sampled split."""
    stack = FaultStack(
        STACK.project,
        STACK.run_dir,
        STACK.bind,
        {**STACK.settings, "SCRIPT": str(SCRIPTS / script), "ARGS": args},
    )
    started = time.monotonic()
    result = stack.make("up", timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    deadline = time.monotonic() + FIRST_SPLIT_TIMEOUT_S
    while len(_safe(stack, f"{SPLIT_SAMPLES.name} > 0")) < len(TASKS):
        assert time.monotonic() < deadline, f"no sampled split on every task:\n{logs(stack)}"
        time.sleep(5)
    print(f"{script} {args}: every task sampled {time.monotonic() - started:.0f} s after make up")
    return stack


def logs(stack: FaultStack) -> str:
    return "\n".join(f"--- {t}\n" + "\n".join(stack.logs(t)[-15:]) for t in TASKS)


def _safe(stack: FaultStack, expr: str) -> dict[str, float]:
    try:
        return stack.prom(expr)
    except OSError:
        return {}  # Prometheus still starting


def diagnose(stack: FaultStack) -> dict:
    """`make diagnose JSON=1`, as a user runs it: this project's current run."""
    result = stack.make("diagnose", "JSON=1", timeout=120)
    report = json.loads(result.stdout)
    assert result.returncode == report["exit_code"], result.stderr
    return report


def wait_for(stack: FaultStack, verdict: str, tasks: tuple[str, ...] | None = None) -> dict:
    """Poll `make diagnose` until it says `verdict` (naming `tasks`) about all three tasks."""
    start, seen = time.monotonic(), []
    while True:
        report = diagnose(stack)
        elapsed = time.monotonic() - start
        seen.append(f"{elapsed:.0f}s {report['verdict']} {report['cluster']['tasks']}")
        assert report["verdict"] != "mismatch", f"runs mixed: {json.dumps(report)[:3000]}"
        if (
            report["verdict"] == verdict
            and (tasks is None or tuple(report["cluster"]["tasks"]) == tasks)
            and len(report["tasks"]) == len(TASKS)
        ):
            print(f"{verdict} after {elapsed:.0f} s (load {os.getloadavg()}):")
            print(json.dumps(report["cluster"], indent=1))
            return report
        assert elapsed < VERDICT_TIMEOUT_S, (
            f"no {verdict} {tasks or ''} within {VERDICT_TIMEOUT_S} s: {seen[-12:]}\n"
            f"{json.dumps(report)[:3000]}\n{logs(stack)}"
        )
        time.sleep(5)


def rate_ratio(stack: FaultStack, numerator: str, denominator: str) -> float:
    """The largest per-task ratio of two counters' rates over MEASURE_WINDOW."""
    by = "by (task_type, task_index)"
    per_task = stack.prom(
        f"sum {by} (rate({numerator}[{MEASURE_WINDOW}])) / sum {by} (rate({denominator}[{MEASURE_WINDOW}]))"
    )
    assert per_task, f"no data for {numerator} / {denominator}"
    return max(per_task.values())


def measure(stack: FaultStack) -> Healthy:
    """The run before its fault: diagnose's verdict, then rates over a whole MEASURE_WINDOW."""
    report = diagnose(stack)
    time.sleep(30)
    cores = stack.prom(
        f'rate(process_cpu_seconds_total{{task_type="worker", task_index="0"}}[{MEASURE_WINDOW}])'
    )
    healthy = Healthy(
        verdict=report["verdict"],
        step_s=rate_ratio(stack, f"{STEP.name}_sum", f"{STEP.name}_count"),
        bytes_per_step=rate_ratio(stack, ALLREDUCE_BYTES.name, STEPS.name),
        worker0_cores=max(cores.values()),
    )
    print(f"before the fault: {healthy}; diagnose: {json.dumps(report['cluster']['evidence'])}")
    return healthy


@pytest.fixture(scope="module")
def project() -> Iterator[None]:
    engine_ready()
    try:
        yield
    finally:
        STACK.make("clean", "FORCE=1", timeout=300)


@pytest.fixture(scope="module")
def fit_run(project) -> tuple[FaultStack, Healthy]:
    stack = up("fit_images.py")
    return stack, measure(stack)


def test_fit_script_with_a_cpu_starved_worker_names_it_the_straggler(fit_run):
    stack, healthy = fit_run
    assert healthy.verdict != "straggler", "a straggler before any fault: the test would prove nothing"
    cpus = max(0.01, round(healthy.worker0_cores / FAULT_FACTOR, 2))
    print(f"worker-0: --cpus {cpus} (it used {healthy.worker0_cores:.2f} cores)")
    worker = stack.container("worker-0")
    sh("docker", "update", "--cpus", str(cpus), worker)
    try:
        report = wait_for(stack, "straggler", ("worker-0",))
        assert report["exit_code"] == 1
        assert report["cluster"]["evidence"][0].startswith("worker-0 computes")
    finally:
        sh("docker", "update", "--cpus", str(os.cpu_count()), worker, check=False)


def test_custom_loop_with_a_rate_limited_link_is_communication_bound(fit_run):
    """Issue 21's sequence: a SCRIPT= run, `make down`, another run with worker-1's link limited."""
    assert STACK.make("down").returncode == 0
    stack = up("custom_loop_mlp.py")
    healthy = measure(stack)
    assert healthy.verdict != "communication-bound", "communication-bound before any fault: proves nothing"
    rate = max(8, round(healthy.bytes_per_step * 8 / (FAULT_FACTOR * healthy.step_s) / 1000))
    pid = stack.inspect("worker-1", "{{.State.Pid}}")
    links = [
        ln.split(": ")[1].split("@")[0]
        for ln in sh("nsenter", "-t", pid, "-n", "ip", "-o", "link").splitlines()
    ]
    tc = ("nsenter", "-t", pid, "-n", "tc", "qdisc")
    for dev in (d for d in links if d != "lo"):
        sh(*tc, "add", "dev", dev, "root", "tbf", "rate", f"{rate}kbit", "burst", "32kbit", "latency", "1s")
    print(f"worker-1: {sh(*tc, 'show')}")
    report = wait_for(stack, "communication-bound")
    assert report["exit_code"] == 1
    assert all(t["verdict"] == "communication-bound" for t in report["tasks"].values())


def test_fit_script_with_a_slow_input_map_is_input_bound(fit_run):
    _, healthy = fit_run
    decode_ms = round(FAULT_FACTOR * healthy.step_s * 1000)
    assert STACK.make("down").returncode == 0
    stack = up("fit_images.py", f"--decode-ms {decode_ms}")
    print(f"decode {decode_ms} ms per batch (healthy step {healthy.step_s * 1000:.0f} ms)")
    report = wait_for(stack, "input-bound")
    assert report["exit_code"] == 1
    named = report["cluster"]["tasks"]
    assert named and all(report["tasks"][t]["verdict"] == "input-bound" for t in named)
