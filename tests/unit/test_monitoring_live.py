"""The whole telemetry path without TensorFlow or Docker: the real exporter (trainer.metrics) on
loopback, a real Prometheus (Debian's binary) scraping it with the generated rules, and the queries
of `make status` and the rule names of `make diagnose` read through monitoring.prom_client.

Steps are recorded in bursts with idle gaps, as a run's calls are: steps per second of step time
must come out as 1 / the step time, whatever the wall-clock pacing."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
import yaml
from prometheus_client import CollectorRegistry

import contract
from monitoring import rules, status
from monitoring.prom_client import Prometheus, PrometheusError
from tests.conftest import need
from trainer.cluster import TaskId
from trainer.metrics import Metrics, Server, StepTiming
from trainer.timing import StepWork

STEP = StepTiming(step=0.0125, input=0.000625, compute=0.01, allreduce=0.001875)
"""80 steps per second of step time; shares 5 %, 80 %, 15 %: a healthy task."""
TASKS = (TaskId(contract.CHIEF, 0), TaskId(contract.WORKER, 0))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    need("prometheus")
    return shutil.which("prometheus") or "prometheus"


@pytest.fixture(scope="module")
def exporters() -> Iterator[dict[str, int]]:
    """Task name -> metrics port, each task stepping in bursts of 20 steps every 0.5 s."""
    stop = threading.Event()
    ports, servers, metrics = {}, [], []
    for task in TASKS:
        registry = CollectorRegistry()
        ports[task.name] = free_port()
        servers.append(Server(registry, ports[task.name], addr="127.0.0.1"))
        metrics.append(Metrics(registry, task))
        metrics[-1].build_info(
            tf_version="test", trainer_version="test", strategy="mwms", communication="AUTO", task="mlp"
        )
        metrics[-1].world_size.set(len(TASKS))
        metrics[-1].state("training")

    def step_forever() -> None:
        step = 0
        while not stop.wait(0.5):
            for _ in range(20):
                step += 1
                for m in metrics:
                    m.record_step(step=step, loss=1.0, work=StepWork(32, 4096), now=time.time(), timing=STEP)

    thread = threading.Thread(target=step_forever, daemon=True)
    thread.start()
    yield ports
    stop.set()
    thread.join()
    for server in servers:
        server.close()


@pytest.fixture(scope="module")
def prom(prometheus_binary, exporters, tmp_path_factory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("prometheus")
    rule_files = sorted(str(p) for p in (rules.PROM_DIR / "rules").glob("*.yml"))
    targets = [{"targets": [f"127.0.0.1:{port}"]} for port in exporters.values()]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": rule_files,
        "scrape_configs": [{"job_name": contract.JOB, "honor_labels": True, "static_configs": targets}],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (work / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            prometheus_binary,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield Prometheus(url=f"http://127.0.0.1:{port}", timeout=5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def poll(prom: Prometheus, expr: str, *, tasks: int, timeout: float = 90) -> dict[str, float]:
    """The expression's value per task once every task has one (Prometheus offers nothing to block on)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = prom.by_task(expr)
        except PrometheusError:
            got = {}  # still starting
        if len(got) >= tasks or time.monotonic() > deadline:
            return got
        time.sleep(1)


def test_status_shows_steps_per_second_of_step_time(prom):
    got = poll(prom, status.QUERIES["steps/s"], tasks=len(TASKS))
    assert got.keys() == {t.name for t in TASKS}
    assert got == pytest.approx(dict.fromkeys(got, 1 / STEP.step), rel=1e-6)


def test_rules_and_verdict_reach_every_task(prom):
    steps = poll(prom, rules.STEPS_PER_SECOND, tasks=len(TASKS))
    assert steps == pytest.approx(dict.fromkeys(steps, 1 / STEP.step), rel=1e-6)
    share = poll(prom, rules.SHARE[contract.ALLREDUCE], tasks=len(TASKS))
    assert share == pytest.approx(dict.fromkeys(share, STEP.allreduce / STEP.step), rel=1e-6)
    codes = poll(prom, rules.VERDICT_CODE, tasks=len(TASKS))
    assert codes == dict.fromkeys((t.name for t in TASKS), 0.0)


def test_status_without_docker_lists_the_tasks_prometheus_sees(prom, capsys):
    poll(prom, status.QUERIES["step time"], tasks=len(TASKS))
    assert status.main(["--no-docker", "--prometheus", prom.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines[1:]] == [[t.name, "training"] for t in TASKS]


def test_status_table_from_the_live_prometheus(prom):
    poll(prom, status.QUERIES["step time"], tasks=len(TASKS))
    rows = status.table({t.name: "running" for t in TASKS}, prom.by_task)
    assert [r[:2] for r in rows[1:]] == [(t.name, "running") for t in TASKS]
    col = {name: i for i, name in enumerate(status.COLUMNS)}
    assert {r[col["steps/s"]] for r in rows[1:]} == {"80.0"}
    assert {r[col["step time"]] for r in rows[1:]} == {"0.013 s"}
