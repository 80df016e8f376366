"""Every step of a user's script into the contract's metrics, with its split.

The hooks (fit.py, loop.py) report each call of the step function as the host saw it. Step time,
the counters, the global step and the loss come from every call. The split comes from the marks the
call's own graph handed over (marks.py): all-reduce and input wait measured in every step, compute
the rest. A step function without marks (XLA-compiled) gets its host time times the ratios of the
last profiler window instead, when the sampler (sampler.py) is turned on; else no split.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import contract as c
from trainer.observe.marks import ALLREDUCE, INPUT, Marks
from trainer.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ratios:
    """Shares of a step's host time, from one profiler window; the rest is dispatch and host."""

    compute: float
    allreduce: float
    input: float


@dataclass(frozen=True)
class Split:
    """Seconds of one call of the step function, by part; the rest is dispatch and host."""

    compute: float
    allreduce: float
    input: float


@dataclass(frozen=True)
class HostCall:
    end: float
    """Unix time the call returned."""
    seconds: float
    steps: int
    split: Split | None = None
    """What the call's split was exported as (marked, or from the last sample)."""
    traced: bool = False


def variable_bytes(variables) -> int:
    return sum(v.shape.num_elements() * v.dtype.size for v in variables)


class Recorder:
    """What the hooks and the sampler share. Thread-safe: the sampler runs in its own thread."""

    def __init__(self, metrics: Metrics, clock: Callable[[], float] = time.time, keep: int = 4096) -> None:
        self.metrics = metrics
        self.clock = clock
        self.functions: set[str] = set()
        """Names of the step functions (tf.function) whose calls the trace is searched for."""
        self._lock = threading.Lock()
        self._calls: deque[HostCall] = deque(maxlen=keep)
        self._ratios: Ratios | None = None
        self.totals = {"step": 0.0, "compute": 0.0, "allreduce": 0.0, "input": 0.0}
        """Seconds observed since the first sample (what the cluster test compares with the trace)."""
        self._said: set[str] = set()
        self.gradient_bytes = 0
        self._total = 0
        self.boundary: Callable[[], None] = lambda: None
        """Called between two calls of the step function, on the calling thread (the sampler starts
        and stops the profiler there)."""
        self.marks = Marks()
        """What the step functions' graphs measure (marks.install wraps TensorFlow to feed it)."""
        self._global_step = 0
        metrics.watch_input(self.input_step)

    def input_step(self) -> int:
        """The step whose batch this task has taken (contract.INPUT_STEP): the global step after the
        last call plus the batches the running call has taken (0 when its input is not marked)."""
        return self._global_step + self.marks.batches

    def begin_call(self) -> None:
        """A call of the step function starts (the hooks call it): what its graph marks is its own."""
        self.marks.clear()
        self.boundary()

    def say_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._said:
            self._said.add(key)
            log.info(message, *args)

    def no_loss(self, why: str) -> None:
        """The step gives no loss: trainer_loss is removed rather than left at 0, and the log says why."""
        if "loss" not in self._said:
            self.say_once("loss", "observe: %s: trainer_loss is not exported", why)
            self.metrics.drop(c.LOSS)

    def step_function(self, name: str) -> None:
        with self._lock:
            self.functions.add(name)

    def setup(self, *, replicas: int | None = None, gradient_bytes: int | None = None) -> None:
        """The job's replicas in sync and the gradient bytes each step hands to the all-reduce
        (the trainable variables' sizes: what the gradient all-reduce of MWMS sends, uncompressed)."""
        if replicas is not None:
            self.metrics.world_size.set(replicas)
        if gradient_bytes is not None:
            self.gradient_bytes = gradient_bytes

    def target(self, steps: int) -> None:
        self.metrics.target(steps)

    def call(
        self,
        seconds: float,
        steps: int,
        *,
        global_step: int,
        examples_per_step: int | None = None,
        loss: float | None = None,
    ) -> None:
        """One call of the step function: `steps` steps in `seconds` of host time."""
        if steps <= 0:
            return
        m, now, per = self.metrics, self.clock(), seconds / steps
        self._global_step = global_step  # before the marks go: the input step never steps back
        marked = self.marks.take()
        with self._lock:
            split = self._split(seconds, marked, self._ratios)
            self._calls.append(HostCall(now, seconds, steps, split))
            self._total += 1
        for _ in range(steps):
            m.step.observe(per)
            if split:
                m.compute.observe(split.compute / steps)
                m.allreduce.observe(split.allreduce / steps)
                m.input.observe(split.input / steps)
        if split:
            for part in ("compute", "allreduce", "input"):
                self.totals[part] += getattr(split, part)
            self.totals["step"] += seconds
        self._count(steps, global_step, examples_per_step, loss)

    def traced(
        self, steps: int, *, global_step: int, examples_per_step: int | None, loss: float | None
    ) -> None:
        """A call that traced the step function: its time went into building the graph (seen: 14 s,
        against 0.5 s per later call). Its steps count; its time goes into neither the step
        histogram nor the split."""
        self._global_step = global_step
        self.marks.clear()
        with self._lock:
            self._calls.append(HostCall(self.clock(), 0.0, steps, None, traced=True))
            self._total += 1
        self._count(steps, global_step, examples_per_step, loss)

    def _count(self, steps: int, global_step: int, examples_per_step: int | None, loss: float | None) -> None:
        m = self.metrics
        m.steps.inc(steps)
        m.allreduce_bytes.inc(self.gradient_bytes * steps)
        if examples_per_step:
            m.examples.inc(examples_per_step * steps)
        m.global_step.set(global_step)
        if loss is not None:
            m.loss.set(loss)
        m.last_step.set(self.clock())

    def _split(self, seconds: float, marked: dict[str, float] | None, ratios: Ratios | None) -> Split | None:
        """The call's seconds of compute, all-reduce and input wait: marked, else sampled, else none."""
        if marked:
            self.metrics.split_sampled.set(0)
            rest = max(seconds - marked[ALLREDUCE] - marked[INPUT], 0.0)
            return Split(compute=rest, allreduce=marked[ALLREDUCE], input=marked[INPUT])
        if ratios:
            return Split(
                compute=seconds * ratios.compute,
                allreduce=seconds * ratios.allreduce,
                input=seconds * ratios.input,
            )
        return None

    def calls_since(self, first: int, last: int) -> list[HostCall]:
        """Host calls number first..last-1 (counted from the start), those still kept."""
        with self._lock:
            kept_from = self._total - len(self._calls)
            return list(self._calls)[max(first - kept_from, 0) : max(last - kept_from, 0)]

    def calls_total(self) -> int:
        with self._lock:
            return self._total

    calls_seen = calls_total

    def summary(self) -> str:
        """One line for the log at exit: what was observed, so a run without Prometheus shows it too."""
        m = self.metrics
        steps, seconds = m.steps._value.get(), m.step._sum.get()
        rate = f", {seconds / steps * 1000:.1f} ms/step" if steps else ""
        return (
            f"observe: {steps:.0f} steps{rate}, global step {m.global_step._value.get():.0f}, "
            f"{m.examples._value.get():.0f} examples, split {self._split_source()} "
            f"(functions: {', '.join(sorted(self.functions)) or 'none seen'})"
        )

    def _split_source(self) -> str:
        if self.marks.seen:
            return "marked in every step"
        return f"from {self.metrics.split_samples._value.get():.0f} profiler windows"

    def set_ratios(self, ratios: Ratios) -> None:
        with self._lock:
            self._ratios = ratios
        self.metrics.split_samples.inc()
        self.metrics.split_sampled.set(1)
