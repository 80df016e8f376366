"""Local MWMS clusters of real TensorFlow processes (chief + workers on 127.0.0.1), tiny MLP.

What a cluster must do: loss falls, replicas end bit-identical, tasks see disjoint
examples, every metric is exposed with sane values while training, the breakdown adds up, the chief
writes checkpoints and every other task keeps its copy, a killed cluster resumes, a missing peer exits 3 naming it.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.launch import free_ports
from trainer.cluster.spec import TaskId, on_ports
from trainer.state import ledger

pytestmark = pytest.mark.cluster
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASKS = ("chief", "worker-0", "worker-1")
BASE_ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
for _key in [k for k in BASE_ENV if k.startswith("TRAINER_") or k == "TF_CONFIG"]:
    del BASE_ENV[_key]


class Launch:
    """`python -m bench.launch` in the background, its output collected line by line."""

    def __init__(self, *args: str, workers: int = 2) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.launch", "--workers", str(workers), *args],
            cwd=ROOT,
            env=BASE_ENV,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait(self, timeout: float = 180) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("cluster timed out:\n" + self.output()[-5000:]) from None

    def output(self) -> str:
        return "".join(self.lines)

    def endpoints(self) -> dict[str, str]:
        found = re.findall(r"\[launch\] (\S+): pid \d+, \S+, metrics (http://\S+)", self.output())
        return dict(found)

    def pids(self) -> list[int]:
        return [int(p) for p in re.findall(r"\[launch\] \S+: pid (\d+)", self.output())]


@pytest.fixture
def launch():
    """Starts launchers; kills each at teardown (its tasks die with it), whatever the outcome."""
    runs: list[Launch] = []

    def start(*args: str) -> Launch:
        runs.append(Launch(*args))
        return runs[-1]

    yield start
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()


def _scrape(url: str) -> dict:
    text = urllib.request.urlopen(url, timeout=2).read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(fams: dict, name: str, sample: str | None = None, **labels) -> float:
    for s in fams[name].samples:
        if s.name == (sample or name) and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(name)


def _summaries(out_dir) -> dict[str, dict]:
    return {t: json.load(open(os.path.join(out_dir, f"{t}.json"))) for t in TASKS}


LATE_STEPS = 250


def _watch_metrics(run: Launch, min_steps: int) -> dict[str, dict]:
    """Each task's metrics scraped while it is training with at least `min_steps` steps done."""
    seen: dict[str, dict] = {}
    while run.proc.poll() is None and len(seen) < len(TASKS):
        for task, url in run.endpoints().items():
            if task in seen:
                continue
            try:
                fams = _scrape(url)
                training = _value(fams, "trainer_state", trainer_state="training") == 1
                if training and _value(fams, "trainer_steps", "trainer_steps_total") >= min_steps:
                    seen[task] = fams
            except (OSError, KeyError):
                pass
        time.sleep(0.5)
    return seen


def test_cluster_trains_identically_on_disjoint_data_with_metrics(tmp_path, launch):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    run = launch(
        "--steps",
        "500",
        "--log-every",
        "125",
        "--save-every",
        "125",
        "--checkpoint-dir",
        str(ckpt),
        "--output-dir",
        str(out),
        "--per-replica-batch",
        "32",
    )
    early = _watch_metrics(run, min_steps=100)
    # Half the job: a window of 250 steps to find every task still training. From 350 the window was
    # 150 steps, a few seconds on an idle machine, and CI's run missed worker-0 in it.
    scraped = _watch_metrics(run, min_steps=LATE_STEPS)
    assert run.wait() == 0, run.output()[-5000:]

    summaries = _summaries(out)
    assert {s["final_step"] for s in summaries.values()} == {500}
    assert len({s["weights_sha256"] for s in summaries.values()}) == 1, "replicas diverged"
    ids = [set(s["example_ids"]) for s in summaries.values()]
    assert all(len(i) > 1000 for i in ids)
    # One job-wide stream, each task its slice of every global batch (trainer/data/position.py): over
    # 500 steps of 96 the epochs wrap, so a task may meet in one epoch what another had in the last;
    # the job's record must hold every step's examples, none twice within an epoch.
    stream, last, epoch = ledger.stream(str(out / ledger.FOLDER))
    assert last == 500 and stream.size == 500 * 3 * 32 and ledger.problems(stream, epoch) == []

    losses = [float(x) for x in re.findall(r"\[chief\] .*\| loss ([0-9.]+)", run.output())]
    assert len(losses) >= 3 and losses[-1] < 0.25 * math.log(4), losses  # it starts at ln(4): 4 classes
    assert summaries["chief"]["accuracy"] > 0.6

    assert set(scraped) == set(early) == set(TASKS), "could not scrape every task while it trained"
    for task, fams in scraped.items():
        _check_metrics(TaskId("chief", 0) if task == "chief" else TaskId("worker", int(task[-1])), fams)
        _check_breakdown(early[task], fams)

    saves = [
        "checkpoint",
        "ckpt-250.data-00000-of-00001",
        "ckpt-250.index",
        "ckpt-250.manifest.json",
        "ckpt-375.data-00000-of-00001",
        "ckpt-375.index",
        "ckpt-375.manifest.json",
        "ckpt-500.data-00000-of-00001",
        "ckpt-500.index",
        "ckpt-500.manifest.json",
    ]
    files = sorted(os.listdir(ckpt))
    # the chief's saves, its export and summary; every other task keeps its own copy of each save
    # under replicas/<task> (trainer/state/checkpoint.py), without an export
    assert files == [*saves, "export", "replicas", "summary.json"], files
    for task in TASKS[1:]:
        copy = sorted(os.listdir(os.path.join(ckpt, "replicas", task)))
        assert copy == saves, (task, copy)


def _check_metrics(task: TaskId, fams: dict) -> None:
    for fam in fams.values():
        for s in fam.samples:
            assert s.labels.get("task_type") == task.type and s.labels.get("task_index") == str(task.index), s
    steps = _value(fams, "trainer_steps", "trainer_steps_total")
    assert steps >= LATE_STEPS
    assert _value(fams, "trainer_examples", "trainer_examples_total") == 32 * steps
    assert _value(fams, "trainer_allreduce_bytes", "trainer_allreduce_bytes_total") > 0
    assert _value(fams, "trainer_network_receive_bytes", "trainer_network_receive_bytes_total") >= 0
    assert _value(fams, "trainer_network_transmit_bytes", "trainer_network_transmit_bytes_total") >= 0
    assert 0 < _value(fams, "trainer_loss") < 2
    assert _value(fams, "trainer_global_step") >= steps
    assert _value(fams, "trainer_world_size") == 3
    assert abs(_value(fams, "trainer_last_step_timestamp_seconds") - time.time()) < 120
    assert _value(fams, "trainer_last_checkpoint_step") in (125, 250, 375)
    info = next(s.labels for s in fams["trainer_build_info"].samples)
    assert info["strategy"] == "mwms" and info["tf_version"].startswith("2.21") and info["task"] == "mlp"
    for name in ("step_duration", "input_wait", "compute_duration", "allreduce_duration"):
        metric = f"trainer_{name}_seconds"
        assert steps - 100 <= _value(fams, metric, metric + "_count") < steps  # the first call traces
        assert _value(fams, metric, metric + "_sum") > 0


def _check_breakdown(early: dict, late: dict) -> None:
    """Between two scrapes (steady state, after start-up), the parts add up to the step within 10%."""

    def delta(name):
        metric = f"trainer_{name}_seconds"
        return _value(late, metric, metric + "_sum") - _value(early, metric, metric + "_sum")

    step = delta("step_duration")
    parts = delta("input_wait") + delta("compute_duration") + delta("allreduce_duration")
    assert step > 0 and abs(step - parts) / step < 0.10, (step, parts)


def _latest_step(ckpt) -> int:
    with open(os.path.join(ckpt, "checkpoint")) as f:
        text = f.read()
    return int(re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', text, re.MULTILINE).group(1))


def test_killed_cluster_resumes_from_checkpoint(tmp_path, launch):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    run = launch(
        "--steps",
        "1000000",
        "--save-every",
        "20",
        "--log-every",
        "20",
        "--checkpoint-dir",
        str(ckpt),
        "--metrics-port",
        "0",
    )
    deadline = time.monotonic() + 120
    while not os.path.exists(ckpt / "checkpoint") or _latest_step(ckpt) < 40:
        assert run.proc.poll() is None and time.monotonic() < deadline, run.output()[-3000:]
        time.sleep(0.2)
    run.proc.send_signal(signal.SIGKILL)  # the children die with it (PR_SET_PDEATHSIG)
    run.wait()
    for pid in run.pids():
        _wait_gone(pid)
    resumed_at = _latest_step(ckpt)

    again = launch(
        "--steps",
        str(resumed_at + 20),
        "--save-every",
        "20",
        "--checkpoint-dir",
        str(ckpt),
        "--measure-every",
        "2",
        "--output-dir",
        str(out),
        "--metrics-port",
        "0",
    )
    assert again.wait() == 0, again.output()[-5000:]
    summaries = _summaries(out)
    # The chief's index may name a save the SIGKILL cut on another task (CI, loaded: index 40, job
    # resumed at 20): the job resumes at the newest step every task holds, that one or the save before.
    started = {s["start_step"] for s in summaries.values()}
    assert len(started) == 1 and started <= {resumed_at, resumed_at - 20}, (started, resumed_at)
    assert {s["final_step"] for s in summaries.values()} == {resumed_at + 20}
    assert len({s["weights_sha256"] for s in summaries.values()}) == 1
    assert f"resumed at step {started.pop()}" in again.output()


def _wait_gone(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"pid {pid} survived its launcher")


def _task_env(spec, task: TaskId, **extra: str) -> dict:
    return {
        **BASE_ENV,
        "TF_CONFIG": spec.with_task(task).to_tf_config(),
        "TRAINER_METRICS_PORT": "0",
        **extra,
    }


def test_missing_peer_exits_3_naming_it():
    spec = on_ports("127.0.0.1", free_ports(3))
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--cluster-timeout", "3"],
        cwd=ROOT,
        text=True,
        env=_task_env(spec, TaskId("chief", 0)),
        capture_output=True,
        timeout=60,
        check=False,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 3, proc.stderr
    assert f"worker-0 ({spec.worker[0]})" in proc.stderr and f"worker-1 ({spec.worker[1]})" in proc.stderr
    assert elapsed < 10


class Tasks:
    """Tasks started directly (no launcher), killed on exit whatever the test's outcome."""

    def __init__(self, spec, envs: dict[TaskId, dict]) -> None:
        self.procs = {
            t: subprocess.Popen(
                [sys.executable, "-m", "trainer"],
                cwd=ROOT,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for t, env in envs.items()
        }

    def __enter__(self) -> dict[TaskId, subprocess.Popen]:
        return self.procs

    def __exit__(self, *exc) -> None:
        for p in self.procs.values():
            p.kill()
            p.wait()


def test_tasks_that_disagree_are_named():
    spec = on_ports("127.0.0.1", free_ports(2))
    chief, worker = TaskId("chief", 0), TaskId("worker", 0)
    with Tasks(
        spec,
        {
            chief: _task_env(spec, chief, TRAINER_STEPS="50"),
            worker: _task_env(spec, worker, TRAINER_STEPS="60"),
        },
    ) as procs:
        outputs = {t: p.communicate(timeout=120)[0] for t, p in procs.items()}
    assert procs[worker].returncode == 2, outputs[worker][-3000:]
    assert "worker-0 differs from chief in training settings" in outputs[worker]


def test_lost_peer_is_a_retryable_exit():
    spec = on_ports("127.0.0.1", free_ports(3))
    envs = {t: _task_env(spec, t, TRAINER_STEPS="1000000", TRAINER_LOG_EVERY="20") for t in spec.tasks}
    lines: list[str] = []
    with Tasks(spec, envs) as procs:
        chief = procs[TaskId("chief", 0)]
        threading.Thread(target=lambda: lines.extend(chief.stdout), daemon=True).start()
        # 40 steps take less than the start-up this run measured (minutes on 2 shared cores): 600 s
        # bounds only a hang of the start-up itself.
        started = time.monotonic()
        _wait_for_line(lines, chief, lambda ln: "starting at step" in ln, started + 600)
        deadline = time.monotonic() + 2 * (time.monotonic() - started) + 60
        _wait_for_line(
            lines, chief, lambda ln: any(int(m) >= 40 for m in re.findall(r"\| step (\d+)/", ln)), deadline
        )
        procs[TaskId("worker", 1)].kill()
        code = chief.wait(timeout=90)
    assert 128 <= code <= 255, "".join(lines)[-3000:]
    assert "a peer was lost" in "".join(lines)


def _wait_for_line(lines: list[str], proc, found, deadline: float) -> None:
    """Until a line of `lines` (a task's output, read meanwhile) is `found`; the task must live on."""
    while not any(found(ln) for ln in lines):
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)[-3000:]
        time.sleep(0.2)
