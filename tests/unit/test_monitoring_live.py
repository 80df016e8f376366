"""The whole telemetry path without TensorFlow or Docker: the real exporter (trainer.telemetry.metrics) on
loopback, a real Prometheus (Debian's binary) scraping it with the generated rules, and the queries
of `make status` and the rule names of `make diagnose` read through monitoring.prom.client.

Steps are recorded in bursts with idle gaps, as a run's calls are: steps per second must come out as
the clock saw them (the steps over the wall-clock time, gaps included), not 1 / the step time."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

import contract
from monitoring import diagnose, status
from monitoring.prom.client import Prometheus, PrometheusError
from monitoring.rules import recording as rules
from tests.conftest import need
from trainer.cluster.spec import TaskId
from trainer.core.timing import StepWork
from trainer.telemetry.metrics import Metrics, Server, StepTiming

STEP = StepTiming(step=0.0125, input=0.000625, compute=0.01, allreduce=0.001875)
"""80 steps per second of step time; shares 5 %, 80 %, 15 %: a healthy task."""
TASKS = (TaskId(contract.CHIEF, 0), TaskId(contract.WORKER, 0))
RUN = "20261201T090000Z"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    need("prometheus")
    return shutil.which("prometheus") or "prometheus"


class Exporters:
    """Real exporters on loopback, one per task, stepping in bursts of 20 steps every 0.5 s."""

    def __init__(self, tasks=TASKS, **build: str) -> None:
        self.stop = threading.Event()
        self.ports, self.servers, self.metrics = {}, [], []
        for task in tasks:
            registry = CollectorRegistry()
            self.ports[task.name] = free_port()
            self.servers.append(Server(registry, self.ports[task.name], addr="127.0.0.1"))
            self.metrics.append(Metrics(registry, task))
            self.metrics[-1].build_info(
                **{"tf_version": "test", "trainer_version": "test", "strategy": "mwms"}
                | {"communication": "AUTO", "task": "mlp"}
                | build
            )
            self.metrics[-1].world_size.set(len(tasks))
            self.metrics[-1].state("training")
        self.thread = threading.Thread(target=self._step_forever, daemon=True)
        self.thread.start()

    def _step_forever(self) -> None:
        step = 0
        self.clock: list[tuple[float, int]] = []  # (time, steps) after each burst: the rate the clock sees
        while not self.stop.wait(0.5):
            for _ in range(20):
                step += 1
                for m in self.metrics:
                    m.record_step(step=step, loss=1.0, work=StepWork(32, 4096), now=time.time(), timing=STEP)
            self.clock.append((time.time(), step))

    def clock_rate(self, seconds: float = 30) -> float:
        """Steps per wall-clock second over the last `seconds` of bursts."""
        end, last = self.clock[-1]
        start, first = next((t, s) for t, s in self.clock if t >= end - seconds)
        return (last - first) / (end - start)

    def targets(self, project: str = contract.DEFAULT_PROJECT, run: str = RUN) -> list[dict]:
        """file_sd, labelled as the emitters label it (contract.TARGET_LABELS)."""
        run_labels = {contract.PROJECT_LABEL: project, contract.RUN_LABEL: run}
        return [
            {
                "targets": [f"127.0.0.1:{port}"],
                "labels": run_labels | dict(zip(contract.LABELS, contract.task_labels(name), strict=True)),
            }
            for name, port in self.ports.items()
        ]

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for server in self.servers:
            server.close()


@pytest.fixture(scope="module")
def exporters() -> Iterator[Exporters]:
    running = Exporters()
    yield running
    running.close()


def write_targets(work: Path, targets: list[dict]) -> None:
    """Whole, then renamed, as compose.generate writes them: Prometheus never reads half a file."""
    (work / "targets.json.tmp").write_text(json.dumps(targets))
    (work / "targets.json.tmp").replace(work / "targets.json")


@contextlib.contextmanager
def prometheus(binary: str, work: Path, targets: list[dict]) -> Iterator[Prometheus]:
    """Debian's Prometheus with the generated rules, scraping file_sd targets in work/targets.json."""
    rule_files = sorted(str(p) for p in (rules.PROM_DIR / "rules").glob("*.yml"))
    write_targets(work, targets)
    sd = [{"files": [str(work / "targets.json")], "refresh_interval": "1s"}]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": rule_files,
        "scrape_configs": [{"job_name": contract.JOB, "honor_labels": True, "file_sd_configs": sd}],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (work / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
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


@pytest.fixture(scope="module")
def prom(prometheus_binary, exporters, tmp_path_factory) -> Iterator[Prometheus]:
    with prometheus(prometheus_binary, tmp_path_factory.mktemp("prometheus"), exporters.targets()) as p:
        yield p


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


def test_status_shows_steps_per_second_as_the_clock_sees_them(prom, exporters):
    """1 / the step time (80 steps/s here) ran ahead of the clock: the bursts pause 0.5 s per 20 steps."""
    poll(prom, status.QUERIES["steps/s"], tasks=len(TASKS))
    while time.time() - exporters.clock[0][0] < 20:  # 20 s of bursts: one burst is 2.5 % of them
        time.sleep(1)
    got = prom.by_task(status.QUERIES["steps/s"])
    clock = exporters.clock_rate(seconds=60)
    print(
        f"make status: {got}; the exporters' own clock: {clock:.1f} steps/s; 1 / step time {1 / STEP.step:.1f}"
    )
    assert got.keys() == {t.name for t in TASKS}
    assert got == pytest.approx(dict.fromkeys(got, clock), rel=0.1)
    outside = prom.by_task(status.QUERIES["outside steps"])
    assert outside == pytest.approx(dict.fromkeys(got, 1 - clock * STEP.step), abs=0.1)


def test_rules_and_verdict_reach_every_task(prom, exporters):
    steps = poll(prom, rules.STEPS_PER_SECOND, tasks=len(TASKS))
    assert steps == pytest.approx(dict.fromkeys(steps, exporters.clock_rate()), rel=0.25)
    share = poll(prom, rules.SHARE[contract.ALLREDUCE], tasks=len(TASKS))
    assert share == pytest.approx(dict.fromkeys(share, STEP.allreduce / STEP.step), rel=1e-6)
    codes = poll(prom, rules.VERDICT_CODE, tasks=len(TASKS))
    assert codes == dict.fromkeys((t.name for t in TASKS), 0.0)


def test_status_without_docker_lists_the_tasks_prometheus_sees(prom, capsys):
    poll(prom, status.QUERIES["step time"], tasks=len(TASKS))
    assert status.main(["--no-docker", "--prometheus", prom.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"job: step {lines[-1].split()[2]} {status.UNKNOWN_TARGET}"  # no target exported
    assert [line.split()[:2] for line in lines[1:-1]] == [[t.name, "training"] for t in TASKS]


def test_status_table_from_the_live_prometheus(prom):
    poll(prom, status.QUERIES["step time"], tasks=len(TASKS))
    rows = status.table({t.name: "running" for t in TASKS}, prom.by_task)
    assert [r[:2] for r in rows[1:]] == [(t.name, "running") for t in TASKS]
    col = {name: i for i, name in enumerate(status.COLUMNS)}
    assert {r[col["steps/s"]] for r in rows[1:]} != {"80.0"}  # 1 / the step time: ahead of the clock
    # 0.0125 s shown to 3 places: 0.012 or 0.013 by the float noise of a rate ratio
    assert {r[col["step time"]] for r in rows[1:]} <= {"0.012 s", "0.013 s"}


def test_a_new_run_is_judged_on_its_own_series(prometheus_binary, tmp_path, capsys):
    """The issue's sequence: a SCRIPT= run, `make down`, `make up` of the built-in trainer a minute
    later, `make diagnose`. The first run's build info is still in Prometheus' 5 minute lookback;
    the verdict must come from the second run only (it said MISMATCH before the run label), and
    the first run must stay readable by its id."""
    first, second = "20261201T080000Z", "20261201T081000Z"
    script = Exporters(strategy="script", communication="script", task="train.py")
    builtin = Exporters()
    try:
        with prometheus(prometheus_binary, tmp_path, script.targets(run=first)) as prom:
            poll(prom, rules.VERDICT_CODE, tasks=len(TASKS))  # the first run scraped and judged
            script.close()  # make down
            write_targets(tmp_path, builtin.targets(run=second))  # make up: same task names, a new run
            poll(prom, rules.MEAN[contract.STEP] + rules.selector(run=second), tasks=len(TASKS))
            bench = str(tmp_path / "no-bench.json")
            code = diagnose.main(["--prometheus", prom.url, "--bench", bench])
            verdict_text = capsys.readouterr().out
            assert verdict_text.startswith("cluster: HEALTHY"), verdict_text
            assert status.main(["--no-docker", "--prometheus", prom.url, "--run", first]) == 0
            earlier = capsys.readouterr().out
    finally:
        builtin.close()
    assert code == 0
    tasks = [line.split()[0] for line in earlier.splitlines()[1:] if not line.startswith("job:")]
    assert tasks == [t.name for t in TASKS]
