"""`make diagnose` on the built-in task's own step marks, on the real containers.

One job (chief + 2 workers, the `cnn` task, so compute dominates when nothing is wrong): healthy (exit
0); then a job with a slow input pipeline (`INPUT_DELAY_MS`, the trainer's own flag) -> input-bound,
naming the tasks that wait for input, with the prefetch advice. The delay is sized from the healthy
step this run measured, never a constant: on a loaded machine a step of 400 ms hides a fixed 400 ms
input delay behind the prefetch. Each verdict must arrive within 2 minutes of the fault, and the
dashboard's recording rule (cluster:trainer_verdict:named) must say the same.

A straggler (`docker update --cpus`) and a slow link (`tc` in a worker's network namespace) were also
injected here until 2026-12-07; tests/e2e/test_script_verdicts.py injects both into a team's own
scripts through the same rules and `make diagnose`, with the dashboard rule's agreement checked there
too, so they run once, on the scripts. Everything runs in its own compose project (`mwms-diagnose`,
RUN_DIR .run/diagnose, Prometheus on 127.0.0.3), so the session `stack` of the other e2e tests is
never touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import contract
from contract import COMPUTE, LAST_STEP_TIME, STEP
from tests.e2e import places
from tests.e2e.conftest import ROOT, engine_ready

pytestmark = [pytest.mark.docker, pytest.mark.measures]

PROJECT = places.DIAGNOSE.project
RUN_DIR = ROOT / ".run" / "diagnose"
BIND = places.DIAGNOSE.bind
PROM = f"http://{BIND}:{contract.PROMETHEUS_PORT}"
STACK = [f"PROJECT={PROJECT}", f"RUN_DIR={RUN_DIR}", f"BIND_ADDR={BIND}", "OFFLINE=1", "GPUS=0"]

VERDICT_TIMEOUT_S = 120
"""What we promise users: each verdict within 2 minutes of the fault starting."""
FIRST_DATA_TIMEOUT_S = 240
# The cnn task with a large batch: compute dominates a healthy step, even with other load on the 2 cores
# (at batch 32 its ~64 KiB all-reduce, latency-bound, already takes ~30% of the step).
LONG_JOB = ["WORKERS=2", "STEPS=100000000", "SAVE_EVERY=0", "TASK=cnn", "PER_REPLICA_BATCH=1024"]
TRAINERS = ("chief", "worker-0", "worker-1")
MEASURE_WINDOW = "30s"
"""Six 5 s scrapes: the healthy step and its compute are rates over this window."""
FAULT_FACTOR = 4
"""The input fault costs this many healthy steps per step, far past the 20 % input wait threshold,
whatever the machine's load made the healthy step."""


@dataclass(frozen=True)
class Healthy:
    """What this run's healthy job measured, before any fault."""

    report: dict
    """`make diagnose` at the healthy verdict."""
    step_s: float
    """Slowest task's mean step, seconds."""
    compute_s: float
    """Slowest task's mean compute per step, seconds (printed: compute dominates a healthy cnn step)."""

    def input_delay_ms(self) -> int:
        # The delay is sequential but prefetched: a task waits (delay - step) per step.
        return max(50, round(FAULT_FACTOR * self.step_s * 1000))


def sh(*cmd: str, timeout: float = 120, check: bool = True) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} -> {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        )
    return result.stdout.strip()


def make(*args: str, timeout: float = 900) -> None:
    result = subprocess.run(
        ["make", "--no-print-directory", *args, *STACK],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"make {' '.join(args)}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def container(service: str) -> str:
    return f"{PROJECT}-{service}-1"


def start_job(make_args: list[str]) -> None:
    """A new training job on this project's stack: SIGKILL the trainers (a recreate would wait out the
    grace period), drop the checkpoints so it starts at step 0, `make up`, return at its first step."""
    sh("docker", "rm", "-f", *map(container, TRAINERS), check=False)
    sh("docker", "volume", "rm", "-f", f"{PROJECT}_checkpoints", check=False)
    make("up", *make_args)
    # The killed job's last steps are older than this (make up takes longer): a step of the new job.
    deadline = time.monotonic() + FIRST_DATA_TIMEOUT_S
    while not _safe_prom(f"time() - max({LAST_STEP_TIME.name}) < 8"):
        assert time.monotonic() < deadline, f"no step of the new job within {FIRST_DATA_TIMEOUT_S} s"
        time.sleep(1)


def diagnose() -> tuple[int, dict]:
    """What `make diagnose JSON=1` runs (this interpreter, so no venv needs building here)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "monitoring.diagnose",
            "--json",
            "--prometheus",
            PROM,
            "--project",  # the project's latest run: start_job's `make up` began a new one
            PROJECT,
            "--bench",
            str(RUN_DIR / "bench-comm.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, json.loads(result.stdout)


def prom(expr: str) -> list[dict]:
    with urllib.request.urlopen(
        f"{PROM}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=5
    ) as r:
        return json.load(r)["data"]["result"]


def _safe_prom(expr: str) -> list[dict]:
    try:
        return prom(expr)
    except OSError:
        return []  # Prometheus still starting


def dashboard_verdict() -> str | None:
    """What the Training overview's verdict panel shows (the recording rule it reads)."""
    result = _safe_prom('cluster:trainer_verdict:named{job="trainer"}')
    return result[0]["metric"].get("verdict") if result else None


def wait_for(verdict: str, *, timeout: float, tasks: tuple[str, ...] | None = None) -> dict:
    """Poll `make diagnose` until it says `verdict` (naming `tasks`) and the recording rule agrees."""
    deadline, seen, rule_agreed = time.monotonic() + timeout, [], False
    start = time.monotonic()
    while True:
        code, report = diagnose()
        rule_agreed = rule_agreed or dashboard_verdict() == verdict
        seen.append(f"{time.monotonic() - start:.0f}s {report['verdict']} {report['cluster']['tasks']}")
        named_ok = tasks is None or tuple(report["cluster"]["tasks"]) == tasks
        if (
            report["verdict"] == verdict
            and named_ok
            and rule_agreed
            and len(report["tasks"]) == len(TRAINERS)
        ):
            print(
                f"{verdict} after {time.monotonic() - start:.0f} s: "
                + "; ".join(report["cluster"]["evidence"])
            )
            return {"exit_code": code, **report}
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no {verdict} {tasks or ''} within {timeout:.0f} s (rule agreed: {rule_agreed}); "
                f"diagnose said: {seen[-12:]}\nlast report: {json.dumps(report)[:3000]}"
            )
        time.sleep(5)


def rate_ratio(numerator: str, denominator: str) -> float:
    """The largest per-task ratio of two counters' rates over MEASURE_WINDOW."""
    by = "by (task_type, task_index)"
    per_task = (
        f"sum {by} (rate({numerator}[{MEASURE_WINDOW}])) / sum {by} (rate({denominator}[{MEASURE_WINDOW}]))"
    )
    result = prom(f"max({per_task})")
    assert result, f"no data for {numerator} / {denominator}"
    return float(result[0]["value"][1])


def measure(report: dict) -> Healthy:
    time.sleep(6 * 5)  # a whole MEASURE_WINDOW of healthy scrapes
    healthy = Healthy(
        report=report,
        step_s=rate_ratio(f"{STEP.name}_sum", f"{STEP.name}_count"),
        compute_s=rate_ratio(f"{COMPUTE.name}_sum", f"{COMPUTE.name}_count"),
    )
    print(f"healthy: {healthy}; load average {os.getloadavg()}")
    return healthy


@pytest.fixture(scope="module")
def long_job() -> Iterator[None]:
    engine_ready()
    try:
        start_job(LONG_JOB)
        yield
    finally:
        # The trainers first, at once: `make clean` of a training job waits for their preemption save and
        # exit (39 s at load 4-7 in the stage that runs alone), which nothing here checks.
        sh("docker", "rm", "-f", *map(container, TRAINERS), check=False)
        make("clean", "FORCE=1", timeout=300)  # containers, this project's volumes and .run/diagnose


@pytest.fixture(scope="module")
def healthy(long_job) -> Healthy:
    return measure(wait_for("healthy", timeout=FIRST_DATA_TIMEOUT_S))


def test_healthy_run_exits_0(healthy):
    assert healthy.report["exit_code"] == 0


def test_slow_input_pipeline_is_input_bound(healthy):
    print(
        f"input delay {healthy.input_delay_ms()} ms per batch (healthy step {healthy.step_s * 1000:.0f} ms)"
    )
    start_job([*LONG_JOB, f"INPUT_DELAY_MS={healthy.input_delay_ms()}"])
    # The fault starts with the job: start_job returns at its first step. Every task has the same slow
    # pipeline, but only the ones that reach their next batch first wait on it (the others meanwhile
    # wait in all-reduce for them), so the verdict names those with input wait above 20%.
    report = wait_for("input-bound", timeout=VERDICT_TIMEOUT_S)
    assert report["exit_code"] == 1
    named = report["cluster"]["tasks"]
    assert named and all(report["tasks"][t]["verdict"] == "input-bound" for t in named)
    assert any("prefetch" in a for a in report["cluster"]["advice"])
