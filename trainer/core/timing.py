"""What a step function returns, what the host makes of one call, of an interval and of the whole loop:
the types that the step (trainer/train/step.py), the host loop (trainer/train/loop.py), the progress
lines, the metrics, TensorBoard's scalars and the summary share. Here, below all of them, so none
imports another's folder for a type.

Standard library only: importing it loads no TensorFlow and no exporter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class StepWork:
    """What one step of this task processes: the same every step of a run."""

    examples: int
    """Examples this task's replicas process per step."""
    allreduce_bytes: int
    """Gradient bytes this task hands to the all-reduce per step, in the dtype sent."""


@dataclass(frozen=True)
class StepTiming:
    """One step's breakdown in seconds; `other` is what the parts do not explain (dispatch, host)."""

    step: float
    input: float
    compute: float
    allreduce: float

    @property
    def other(self) -> float:
        return self.step - self.input - self.compute - self.allreduce


@dataclass(frozen=True)
class StepFns:
    """The compiled step functions of one task (trainer.train.step.build makes them)."""

    timed: Callable
    """(iterator, n) -> marks [n, 5] (t_start, t0..t3 of replica 0), stats [loss, accuracy], ids"""
    plain: Callable
    """(iterator, n) -> the same arithmetic without marks (marks is then [n, 0])"""
    allreduce_bytes: int
    """Gradient bytes each replica all-reduces per step."""
    input_step: Callable[[], int] = lambda: 0
    """The step whose batch this task has taken so far, readable while a call runs (a scrape reads it)."""


@dataclass(frozen=True)
class CallOutput:
    """One call of a step function as the host saw it: what the loop's actions receive."""

    step: int
    """The global step after the call."""
    timings: tuple[StepTiming | None, ...]
    """One per step of the call; None for an untimed step or a call that traced its function."""
    loss: float
    accuracy: float | None
    ids: np.ndarray | None
    """Example ids this task consumed in the call (only with --output-dir)."""
    now: float
    """Unix time at which the call returned."""

    @property
    def steps(self) -> int:
        return len(self.timings)


@dataclass
class Interval:
    """Accumulates steps between two progress lines (or two TensorBoard writes)."""

    start_time: float
    steps: int = 0
    timings: list[StepTiming] = field(default_factory=list)

    def mean(self) -> StepTiming | None:
        if not self.timings:
            return None
        n = len(self.timings)
        return StepTiming(
            step=sum(t.step for t in self.timings) / n,
            input=sum(t.input for t in self.timings) / n,
            compute=sum(t.compute for t in self.timings) / n,
            allreduce=sum(t.allreduce for t in self.timings) / n,
        )


@dataclass
class LoopResult:
    """What the host loop returns: where it started and ended, the last loss, the example ids of each call."""

    start_step: int
    final_step: int
    loss: float = float("nan")
    accuracy: float | None = None
    ids: list[np.ndarray] = field(default_factory=list)
