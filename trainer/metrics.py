"""Prometheus metrics of one task: the names, labels and types here are a contract.

Dashboards, alerts and tests depend on them. Every series carries `task_type` and `task_index`.
A dedicated CollectorRegistry is passed in (no global default registry), and `NullMetrics` is the
same interface doing nothing, for --metrics-port 0.
"""

from __future__ import annotations

import logging

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

from trainer.cluster import TaskId
from trainer.errors import ConfigError
from trainer.netdev import LabelledCollector, NetworkCollector
from trainer.timing import StepTiming

log = logging.getLogger(__name__)

# From 0.25 ms (an input wait that is all prefetched) to a minute (a large GPU step waiting on a
# slow peer): dense around 2-50 ms where CPU steps live, then roughly x2 steps up to 60 s.
BUCKETS = (0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
           0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
STATES = ("starting", "waiting_for_peers", "training", "checkpointing", "done", "failed")
LABELS = ("task_type", "task_index")


class TaskMetrics:
    """What every task exports, also a bring-your-own script: build info, state, process, network."""

    def __init__(self, registry: CollectorRegistry, task: TaskId) -> None:
        self.labels = {"task_type": task.type, "task_index": str(task.index)}
        self._info = Info("trainer_build", "Versions and setup of this task", LABELS, registry=registry)
        self._state = Enum("trainer_state", "Lifecycle state of this task", LABELS, states=list(STATES),
                           registry=registry).labels(**self.labels)
        registry.register(NetworkCollector(self.labels))
        registry.register(LabelledCollector(ProcessCollector(registry=None), self.labels))

    def build_info(self, **info: str) -> None:
        self._info.labels(**self.labels).info({k: str(v) for k, v in info.items()})

    def state(self, state: str) -> None:
        self._state.state(state)


class Metrics:
    """All metrics of a training task (TaskMetrics plus the per-step series)."""

    def __init__(self, registry: CollectorRegistry, task: TaskId) -> None:
        labels = {"task_type": task.type, "task_index": str(task.index)}
        self.registry = registry

        def histogram(name: str, doc: str):
            return Histogram(name, doc, LABELS, buckets=BUCKETS, registry=registry).labels(**labels)

        def counter(name: str, doc: str):
            return Counter(name, doc, LABELS, registry=registry).labels(**labels)

        def gauge(name: str, doc: str):
            return Gauge(name, doc, LABELS, registry=registry).labels(**labels)

        self.step = histogram("trainer_step_duration_seconds", "Whole training step, host wall clock")
        self.input = histogram("trainer_input_wait_seconds", "Waiting for the next distributed batch")
        self.compute = histogram("trainer_compute_duration_seconds",
                                 "Forward, backward and optimizer update on the local replica")
        self.allreduce = histogram("trainer_allreduce_duration_seconds",
                                   "Cross-replica gradient all-reduce, including waiting for the slowest task")
        self.dispatch = histogram("trainer_dispatch_duration_seconds",
                                  "Step time the parts do not explain: function dispatch and host loop")
        self.steps = counter("trainer_steps", "Training steps completed by this task")
        self.examples = counter("trainer_examples", "Examples processed by this task's replicas")
        self.allreduce_bytes = counter("trainer_allreduce_bytes", "Gradient bytes all-reduced by this task")
        self.loss = gauge("trainer_loss", "Global mean training loss of the last step")
        self.global_step = gauge("trainer_global_step", "Optimizer step (continues after a resume)")
        self.world_size = gauge("trainer_world_size", "Replicas in sync")
        self.last_step = gauge("trainer_last_step_timestamp_seconds", "Unix time the last step finished")
        self.last_checkpoint = gauge("trainer_last_checkpoint_step", "Step of the last checkpoint saved")
        self._task = TaskMetrics(registry, task)

    def build_info(self, **info: str) -> None:
        self._task.build_info(**info)

    def state(self, state: str) -> None:
        self._task.state(state)

    def record_step(self, *, step: int, loss: float, examples: int, allreduce_bytes: int, now: float,
                    timing: StepTiming | None) -> None:
        self.steps.inc()
        self.examples.inc(examples)
        self.allreduce_bytes.inc(allreduce_bytes)
        self.loss.set(loss)
        self.global_step.set(step)
        self.last_step.set(now)
        if timing is not None:
            self.step.observe(timing.step)
            self.input.observe(timing.input)
            self.compute.observe(timing.compute)
            self.allreduce.observe(timing.allreduce)
            self.dispatch.observe(max(0.0, timing.other))

    def checkpointed(self, step: int) -> None:
        self.last_checkpoint.set(step)


class NullMetrics:
    """Metrics disabled: the same calls, doing nothing."""

    def build_info(self, **info: str) -> None: ...
    def state(self, state: str) -> None: ...
    def record_step(self, **kwargs) -> None: ...
    def checkpointed(self, step: int) -> None: ...
    world_size = type("NullGauge", (), {"set": staticmethod(lambda value: None)})()


class Server:
    """The /metrics endpoint; `close()` stops it."""

    def __init__(self, registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> None:
        try:
            self._server, self._thread = start_http_server(port, addr=addr, registry=registry)
        except OSError as err:
            raise ConfigError(f"--metrics-port {port} (TRAINER_METRICS_PORT): cannot listen ({err.strerror}); "
                              "pick a free port or 0 to disable metrics") from None
        log.info("metrics on http://%s:%d/metrics", addr, port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def for_task(task: TaskId, port: int) -> tuple[Metrics | NullMetrics, Server | None]:
    """The task's metrics and server; port 0 gives NullMetrics and no server."""
    if port == 0:
        return NullMetrics(), None
    registry = CollectorRegistry()
    metrics = Metrics(registry, task)
    return metrics, Server(registry, port)
