"""Prometheus metrics of one task, exported under the names, types and help of contract/__init__.py.

Dashboards, alerts and tests depend on them. Every series carries `task_type` and `task_index`.
A dedicated CollectorRegistry is passed in (no global default registry), and `NullMetrics` is the
same interface doing nothing, for --metrics-port 0.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    start_http_server,
)

import contract as c
from trainer.cluster.spec import EVERY_ADDRESS, TaskId
from trainer.core.timing import StepTiming, StepWork
from trainer.errors import ConfigError
from trainer.telemetry.netdev import LabelledCollector, NetworkCollector

log = logging.getLogger(__name__)

# From 0.25 ms (an input wait that is all prefetched) to a minute (a large GPU step waiting on a
# slow peer): dense around 2-50 ms where CPU steps live, then roughly x2 steps up to 60 s.
BUCKETS = (
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
)


def _labels(task: TaskId) -> dict[str, str]:
    return dict(zip(c.LABELS, (task.type, str(task.index)), strict=True))


class TaskMetrics:
    """What every task exports, also a bring-your-own script: build info, state, process, network."""

    def __init__(self, registry: CollectorRegistry, task: TaskId) -> None:
        self.labels = _labels(task)
        self._info = Info(c.BUILD_INFO.client_name, c.BUILD_INFO.help, c.LABELS, registry=registry)
        self._settings = Info(c.RUN_SETTINGS.client_name, c.RUN_SETTINGS.help, c.LABELS, registry=registry)
        self._state = Enum(
            c.STATE.client_name, c.STATE.help, c.LABELS, states=list(c.STATES), registry=registry
        ).labels(**self.labels)
        self._stuck = {
            m: Gauge(m.client_name, m.help, c.LABELS, registry=registry) for m in (c.STUCK_STEP, c.STUCK_TIME)
        }
        registry.register(NetworkCollector(self.labels))
        registry.register(LabelledCollector(ProcessCollector(registry=None), self.labels))

    def build_info(self, **info: str) -> None:
        self._info.labels(**self.labels).info({k: str(v) for k, v in info.items()})

    def run_settings(self, **settings: str) -> None:
        """The run's settings (contract.RUN_SETTING_LABELS; one missing is exported empty)."""
        values = {k: str(settings.get(k, "")) for k in c.RUN_SETTING_LABELS}
        self._settings.labels(**self.labels).info(values)

    def state(self, state: str) -> None:
        self._state.state(state)

    def stuck(self, step: int, at: float) -> None:
        """Its supervisor ended this task's previous run as stuck at `step`, at Unix time `at`."""
        self._stuck[c.STUCK_STEP].labels(**self.labels).set(step)
        self._stuck[c.STUCK_TIME].labels(**self.labels).set(at)


class UntilSet:
    """A gauge exported only once set. A task that has not met its cluster yet (a script before its
    strategy, a task restarting) knows no world size; a 0 made every peer's verdict a MISMATCH."""

    def __init__(self, family: Gauge, labels: dict[str, str]) -> None:
        self._family, self._labels = family, labels

    def set(self, value: float) -> None:
        self._family.labels(**self._labels).set(value)


class Metrics:
    """All metrics of a training task (TaskMetrics plus the per-step series)."""

    def __init__(self, registry: CollectorRegistry, task: TaskId) -> None:
        labels = _labels(task)
        self._label_values = tuple(labels.values())
        self.registry = registry

        self._families = {}

        def make(metric: c.Metric, cls, **kwargs):
            family = cls(metric.client_name, metric.help, c.LABELS, registry=registry, **kwargs)
            self._families[metric] = family
            return family.labels(**labels)

        def histogram(metric: c.Metric):
            return make(metric, Histogram, buckets=BUCKETS)

        self.step = histogram(c.STEP)
        self.input = histogram(c.INPUT_WAIT)
        self.compute = histogram(c.COMPUTE)
        self.allreduce = histogram(c.ALLREDUCE)
        self.steps = make(c.STEPS, Counter)
        self.examples = make(c.EXAMPLES, Counter)
        self.allreduce_bytes = make(c.ALLREDUCE_BYTES, Counter)
        self.loss = make(c.LOSS, Gauge)
        self.global_step = make(c.GLOBAL_STEP, Gauge)
        world = Gauge(c.WORLD_SIZE.client_name, c.WORLD_SIZE.help, c.LABELS, registry=registry)
        self._families[c.WORLD_SIZE] = world
        self.world_size = UntilSet(world, labels)
        self.last_step = make(c.LAST_STEP_TIME, Gauge)
        self.input_step = make(c.INPUT_STEP, Gauge)
        self.last_checkpoint = make(c.LAST_CHECKPOINT, Gauge)
        self.target_steps = make(c.TARGET_STEPS, Gauge)
        self.split_sampled = make(c.SPLIT_SAMPLED, Gauge)
        self.split_samples = make(c.SPLIT_SAMPLES, Counter)
        self._task = TaskMetrics(registry, task)

    def build_info(self, **info: str) -> None:
        self._task.build_info(**info)

    def run_settings(self, **settings: str) -> None:
        self._task.run_settings(**settings)

    def state(self, state: str) -> None:
        self._task.state(state)

    def stuck(self, step: int, at: float) -> None:
        self._task.stuck(step, at)

    def watch_input(self, read: Callable[[], int]) -> None:
        """The input step is read at each scrape: it must move while a call runs (trainer/train/step.py)."""

        def value() -> float:
            try:
                return float(read())
            except Exception:  # the variable is gone (the process is ending): a scrape must still answer
                return float("nan")

        self.input_step.set_function(value)

    def record_step(
        self, *, step: int, loss: float, work: StepWork, now: float, timing: StepTiming | None
    ) -> None:
        self.steps.inc()
        self.examples.inc(work.examples)
        self.allreduce_bytes.inc(work.allreduce_bytes)
        self.loss.set(loss)
        self.global_step.set(step)
        self.last_step.set(now)
        if timing is not None:
            self.step.observe(timing.step)
            self.input.observe(timing.input)
            self.compute.observe(timing.compute)
            self.allreduce.observe(timing.allreduce)

    def checkpointed(self, step: int) -> None:
        self.last_checkpoint.set(step)

    def target(self, steps: int) -> None:
        """The global step the run ends at (for progress and ETA), when known."""
        self.target_steps.set(steps)

    def drop(self, metric: c.Metric) -> None:
        """Stop exporting a series this task cannot measure (absent, not a misleading 0)."""
        self._families[metric].remove(*self._label_values)


class NullMetrics:
    """Metrics disabled: the same calls, doing nothing."""

    def build_info(self, **info: str) -> None: ...
    def run_settings(self, **settings: str) -> None: ...
    def state(self, state: str) -> None: ...
    def stuck(self, step: int, at: float) -> None: ...
    def watch_input(self, read) -> None: ...
    def record_step(self, **kwargs) -> None: ...
    def checkpointed(self, step: int) -> None: ...
    def target(self, steps: int) -> None: ...
    def drop(self, metric: c.Metric) -> None: ...

    world_size = type("NullGauge", (), {"set": staticmethod(lambda value: None)})()


LINGER_POLL_S = 0.25
"""How soon a lingering task notices SIGTERM: a wake-up costs nothing, a late exit delays `make down`."""


class Server:
    """The /metrics endpoint; `close()` stops it."""

    def __init__(self, registry: CollectorRegistry, port: int, addr: str = EVERY_ADDRESS) -> None:
        try:
            self._server, self._thread = start_http_server(port, addr=addr, registry=registry)
        except OSError as err:
            raise ConfigError(
                f"--metrics-port {port} (TRAINER_METRICS_PORT): cannot listen ({err.strerror}); "
                "pick a free port or 0 to disable metrics"
            ) from None
        log.info("metrics on http://%s:%d/metrics", addr, port)

    def linger(self, seconds: float) -> None:
        """Keep serving `seconds` more for Prometheus' last scrapes, or until SIGTERM (`make down`).

        By then TensorFlow holds SIGTERM (MWMS's preemption notifier, PreemptionCheckpointHandler) and only
        records it, so a finished task's `make down` waited out the whole linger (17 s measured). The
        signal may land on any thread, whose C handler only flags it for the main thread: the main thread
        wakes every LINGER_POLL_S to run its handler, as one long sleep would not.
        """
        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
        # Logged only once the handler is set: a SIGTERM sent on seeing this line must end the linger.
        log.info("done; serving metrics %.0fs more for the last scrapes (SIGTERM ends it)", seconds)
        deadline = time.monotonic() + seconds
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            stop.wait(min(left, LINGER_POLL_S))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def for_task(
    task: TaskId, port: int, host: str = EVERY_ADDRESS
) -> tuple[Metrics | NullMetrics, Server | None]:
    """The task's metrics and server on `host` (ClusterSpec.listen_host); port 0 gives NullMetrics and
    no server."""
    if port == 0:
        return NullMetrics(), None
    registry = CollectorRegistry()
    metrics = Metrics(registry, task)
    return metrics, Server(registry, port, host)
