"""The Docker stack, once per test session: `make up` (offline path) -> every target up -> tests -> `make down`.

Other end-to-end tests take the `stack` fixture; Prometheus stays up for the whole session (the
trainers finish on their own). With CI=true a missing Docker engine or Compose is a failure, not a skip
(tests/conftest.py).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import contract
from contract import STEPS as STEPS_METRIC
from monitoring.prom.client import Prometheus, PrometheusError
from tests.conftest import ROOT, need
from tests.e2e import places

WORKERS = 2
# Long enough that Prometheus (5 s scrapes) sees every task running: ~25 ms per step here.
STEPS = 400
MAKE_ARGS = [
    f"WORKERS={WORKERS}",
    f"STEPS={STEPS}",
    "TASK=mlp",  # the tiny task these timeouts were sized with, not make up's heavier default (cnn)
    "SAVE_EVERY=100",
    "OFFLINE=1",
    "GPUS=0",
    "ARGS=--input-delay-ms 25",
]
PROJECT, BIND = places.SESSION
RUN_DIR = ROOT / ".run" / PROJECT
PLACE = [f"PROJECT={PROJECT}", f"RUN_DIR={RUN_DIR}", f"BIND_ADDR={BIND}"]
"""Every make command of the session stack names its place: a variable given after it wins."""
UP_TIMEOUT_S = 1800  # a cold machine builds everything first
# Every target up and a first step seen: seconds on an idle machine, minutes when the 2 cores are shared.
TARGETS_TIMEOUT_S = 600


@dataclass(frozen=True)
class Stack:
    prometheus_url: str
    workers: int
    steps: int
    run_dir: Path
    root: Path
    up_output: str
    """What `make up` printed (stdout and stderr)."""
    up_seconds: float
    """`make up` wall time; the first step seen in Prometheus is `first_step_seconds` after it started."""
    first_step_seconds: float
    started: float = 0.0
    """time.time() when `make up` started: queries over the whole run reach back to it."""

    @property
    def tasks(self) -> list[tuple[str, str]]:
        return [("chief", "0")] + [("worker", str(i)) for i in range(self.workers)]

    def query(self, expr: str) -> dict[tuple[str, str], float]:
        return query(self.prometheus_url, expr)

    @staticmethod
    def container(service: str) -> str:
        return f"{PROJECT}-{service}-1"

    def make(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["make", "--no-print-directory", *PLACE, *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def query(url: str, expr: str) -> dict[tuple[str, str], float]:
    """An instant query through the project's one Prometheus client, keyed (task_type, task_index)."""
    return {_key(name): value for name, value in Prometheus(url=url, timeout=5).by_task(expr).items()}


def trainer_targets(url: str) -> dict[tuple[str, str], str]:
    return {_key(name): health for name, health in Prometheus(url=url, timeout=5).targets().items()}


def _key(name: str) -> tuple[str, str]:
    return contract.task_labels(name)


def engine_ready() -> None:
    """For fixtures that cannot take the `docker_engine` fixture as an argument."""
    need("docker engine")


@pytest.fixture(scope="session")
def stack(docker_engine) -> Iterator[Stack]:
    url = f"http://{BIND}:{contract.PROMETHEUS_PORT}"
    # A new job and a new history: `make up` after `make down` resumes from the checkpoint volume, and
    # Prometheus would still hold earlier runs' tasks (e.g. a WORKERS=3 run) inside the tests' windows.
    subprocess.run(
        ["make", "--no-print-directory", "clean", "FORCE=1", *PLACE],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    start, started = time.monotonic(), time.time()
    up = subprocess.run(
        ["make", "--no-print-directory", "up", *PLACE, *MAKE_ARGS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=UP_TIMEOUT_S,
    )
    up_seconds = time.monotonic() - start
    try:
        assert up.returncode == 0, f"make up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
        want = {("chief", "0")} | {("worker", str(i)) for i in range(WORKERS)}
        first_step, seen_up, deadline = None, set(), time.monotonic() + TARGETS_TIMEOUT_S
        while time.monotonic() < deadline and (first_step is None or seen_up != want):
            try:
                seen_up |= {k for k, health in trainer_targets(url).items() if health == "up"}
                if first_step is None and query(url, f"{STEPS_METRIC.name} > 0"):
                    first_step = time.monotonic() - start
            except (OSError, PrometheusError):
                pass  # Prometheus still starting
            time.sleep(0.5)
        assert seen_up == want, f"Prometheus saw only {sorted(seen_up)} up, expected {sorted(want)}"
        yield Stack(
            prometheus_url=url,
            workers=WORKERS,
            steps=STEPS,
            run_dir=RUN_DIR,
            root=ROOT,
            up_output=up.stdout + up.stderr,
            up_seconds=up_seconds,
            first_step_seconds=first_step or float("nan"),
            started=started,
        )
    finally:
        down = subprocess.run(
            ["make", "--no-print-directory", "down", *PLACE],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        left = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        volumes = subprocess.run(
            ["docker", "volume", "ls", "-q"], capture_output=True, text=True
        ).stdout.split()
        # Reported as an error of the last test: `make down` must leave no containers and keep history.
        assert down.returncode == 0 and not left, f"make down left {left}: {down.stderr[-2000:]}"
        assert f"{PROJECT}_prometheus-data" in volumes, "make down removed the Prometheus history volume"
