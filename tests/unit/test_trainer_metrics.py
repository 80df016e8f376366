"""Metric names, types and labels are a contract with dashboards and alerts: frozen here."""

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import contract
from trainer.cluster.spec import TaskId
from trainer.core.timing import StepTiming, StepWork
from trainer.telemetry import metrics, netdev
from trainer.telemetry.metrics import Metrics, NullMetrics

# Frozen: the series names as Prometheus stores them. Changing one breaks users' queries and alerts.
CONTRACT = {
    "trainer_step_duration_seconds": "histogram",
    "trainer_input_wait_seconds": "histogram",
    "trainer_compute_duration_seconds": "histogram",
    "trainer_allreduce_duration_seconds": "histogram",
    "trainer_steps_total": "counter",
    "trainer_examples_total": "counter",
    "trainer_allreduce_bytes_total": "counter",
    "trainer_network_transmit_bytes_total": "counter",
    "trainer_network_receive_bytes_total": "counter",
    "trainer_loss": "gauge",
    "trainer_global_step": "gauge",
    "trainer_world_size": "gauge",
    "trainer_last_step_timestamp_seconds": "gauge",
    "trainer_input_step": "gauge",
    "trainer_stuck_step": "gauge",
    "trainer_stuck_timestamp_seconds": "gauge",
    "trainer_last_checkpoint_step": "gauge",
    "trainer_checkpoint_blocked_seconds_total": "counter",
    "trainer_target_steps": "gauge",
    "trainer_split_sampled": "gauge",
    "trainer_split_samples_total": "counter",
    "trainer_build": "info",
    "trainer_run_settings": "info",
    "trainer_state": "enum",
}
# How the text format exposes each kind: families of counters lose _total, infos and enums are gauges.
EXPOSED = {"counter": "counter", "histogram": "histogram", "gauge": "gauge", "info": "gauge", "enum": "gauge"}

PROC_NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0
  eth0:  5000      50    0    0    0     0          0         0     7000      70    0    0    0     0       0          0
  eth1:   100       1    0    0    0     0          0         0      200       2    0    0    0     0       0          0
"""


def _families(registry):
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _recorded():
    registry = CollectorRegistry()
    m = Metrics(registry, TaskId("worker", 2))
    m.build_info(
        tf_version="2.21.0", trainer_version="0.1.0", strategy="mwms", communication="AUTO", task="mlp"
    )
    m.run_settings(task="mlp", bytes_per_pack="0")
    m.state("training")
    m.world_size.set(3)
    m.record_step(
        step=5,
        loss=0.5,
        work=StepWork(32, 1000),
        now=1e9,
        timing=StepTiming(step=0.02, input=0.001, compute=0.01, allreduce=0.008),
    )
    m.checkpointed(5)
    m.watch_input(lambda: 6)
    m.stuck(4, 1e9 - 60)
    return registry


def test_the_input_step_is_read_at_each_scrape_and_a_failed_read_is_nan():
    registry, taken = CollectorRegistry(), [7]
    m = Metrics(registry, TaskId("worker", 1))
    m.watch_input(lambda: taken[0])
    read = lambda: registry.get_sample_value("trainer_input_step", {"task_type": "worker", "task_index": "1"})  # noqa: E731
    assert read() == 7
    taken[0] = 8
    assert read() == 8

    def gone() -> int:
        raise RuntimeError("the variable is gone")

    m.watch_input(gone)
    assert read() != read()  # NaN


def test_contract_is_frozen():
    assert {m.name: m.kind for m in contract.ALL} == CONTRACT


def test_every_contract_metric_is_exported_under_its_name():
    fams = _families(_recorded())
    series = {s.name: f.type for f in fams.values() for s in f.samples}
    for m in contract.ALL:
        name = m.count if m.kind == contract.HISTOGRAM else contract.exposed_name(m)
        assert series.get(name) == EXPOSED[m.kind], (m.name, series.get(name))


def test_every_series_has_task_labels():
    for fam in _families(_recorded()).values():
        for sample in fam.samples:
            assert sample.labels["task_type"] == "worker" and sample.labels["task_index"] == "2", sample


def test_values_recorded():
    fams = _families(_recorded())
    value = lambda name, suffix="": next(s.value for s in fams[name].samples if s.name == name + suffix)
    assert value("trainer_steps", "_total") == 1
    assert value("trainer_examples", "_total") == 32
    assert value("trainer_allreduce_bytes", "_total") == 1000
    assert value("trainer_step_duration_seconds", "_sum") == 0.02
    assert value("trainer_world_size") == 3 and value("trainer_last_checkpoint_step") == 5
    states = {s.labels["trainer_state"]: s.value for s in fams["trainer_state"].samples}
    assert states["training"] == 1 and sum(states.values()) == 1


def test_buckets_resolve_cpu_and_gpu_steps():
    assert any(0.004 <= b <= 0.006 for b in metrics.BUCKETS)  # a 5 ms CPU step
    assert sum(1 for b in metrics.BUCKETS if b <= 0.05) >= 8
    assert metrics.BUCKETS[-1] >= 30  # multi-second GPU steps waiting on a slow peer


def test_null_metrics_has_the_same_interface():
    public = {n for n in dir(Metrics) if not n.startswith("_")}
    assert public - {"registry"} <= set(dir(NullMetrics))
    NullMetrics().record_step(step=1, loss=0.0, work=StepWork(1, 1), now=0.0, timing=None)
    NullMetrics().world_size.set(3)


def test_port_zero_disables():
    m, server = metrics.for_task(TaskId("chief", 0), 0)
    assert isinstance(m, NullMetrics) and server is None


def test_netdev_parse_skips_loopback():
    assert netdev.parse(PROC_NET_DEV) == (5100, 7200)


def test_network_collector_reads_at_scrape():
    registry = CollectorRegistry()
    registry.register(
        netdev.NetworkCollector({"task_type": "chief", "task_index": "0"}, read=lambda: PROC_NET_DEV)
    )
    fams = _families(registry)
    assert fams["trainer_network_transmit_bytes"].samples[0].value == 7200


def test_step_timing_other():
    assert abs(StepTiming(step=0.02, input=0.001, compute=0.01, allreduce=0.008).other - 0.001) < 1e-12


def test_busy_port_is_a_config_error():
    import socket

    import pytest

    from trainer.errors import ConfigError

    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        with pytest.raises(ConfigError, match="--metrics-port"):
            metrics.Server(CollectorRegistry(), busy.getsockname()[1])


def test_world_size_is_absent_until_the_task_knows_it():
    """A task before its strategy exists (a SCRIPT= run's start, every restart) exported world size 0,
    and `make diagnose` called its peers' cluster a MISMATCH ("chief: world size 0, others 3")."""
    registry = CollectorRegistry()
    m = Metrics(registry, TaskId("chief", 0))
    assert not _families(registry)["trainer_world_size"].samples
    m.world_size.set(3)
    assert [s.value for s in _families(registry)["trainer_world_size"].samples] == [3]


def test_run_settings_export_every_label_missing_ones_empty():
    fams = _families(_recorded())
    (sample,) = fams["trainer_run_settings_info"].samples
    assert set(sample.labels) == {*contract.LABELS, *contract.RUN_SETTING_LABELS}
    assert sample.labels["bytes_per_pack"] == "0" and sample.labels["allreduce_dtype"] == ""


LINGERING_TASK = """
import logging, signal, sys, time
from prometheus_client import CollectorRegistry
from trainer.telemetry import metrics
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
class Paused(logging.Handler):  # a busy machine may pause the task right after it writes a line (CI did)
    def emit(self, record):
        sys.stderr.flush()
        time.sleep(1)
logging.getLogger().addHandler(Paused())
server = metrics.Server(CollectorRegistry(), 0, addr="127.0.0.1")
signal.signal(signal.SIGTERM, lambda *_: None)  # as TensorFlow's preemption notifier: SIGTERM only recorded
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # it lands on a server thread, as on TensorFlow's
server.linger(600)
server.close()
print("linger ended")
"""


def test_sigterm_ends_a_finished_tasks_metrics_linger():
    """A finished job's `make down` waited out the whole linger: TensorFlow held SIGTERM by then, and
    the signal lands on whichever thread the kernel picks; and the line that says SIGTERM ends it must
    come only once it does (CI sent SIGTERM in between). Bounded by the 600 s linger, not timed."""
    import os
    import signal
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    task = subprocess.Popen(
        [sys.executable, "-c", LINGERING_TASK],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in task.stderr:
            if "SIGTERM ends it" in line:
                break
        task.send_signal(signal.SIGTERM)
        out, err = task.communicate(timeout=300)
    finally:
        task.kill()
    assert task.returncode == 0 and out == "linger ended\n", (task.returncode, out, err)
