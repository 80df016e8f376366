"""The stall watch: a trainer whose step stops advancing (a hung input pipeline, a collective that
never completes) still heartbeats, so nothing else ends it.

Once its step has advanced in this run, the supervisor reads `trainer_global_step` and the step
histogram's p99 from the same /metrics (trainer/supervise/probe.py); when the step has not moved for
longer than SUPERVISE_STALL = "multiple,floor,ceiling" (default "20,60,900": 20 x the p99 step, at
least 60 s, at most 900 s; "0" disables), it finds the stuck task. Every task of a stuck job sees its
step frozen (the others wait in the collective), so each supervisor reads every task's
`trainer_input_step` (the step whose batch the task has taken: its own /metrics and its peers', on the
same port at their TF_CONFIG hosts): the tasks behind the others are the ones not in the collective.
What the supervisor then does (trainer/supervise/supervisor.py, `_on_stuck`): a supervisor whose task
is behind, or that finds nobody behind (all equal, or peers unreadable), ends its task: SIGUSR2 (the
trainer's faulthandler writes every thread's Python stack to the log), then SIGKILL: exit 137,
retryable. Its peers' collectives then fail (exit 200) and every task restarts from the last
checkpoint, or ends with that line when the budget is spent; the next run exports the stuck step and
time (SUPERVISE_STUCK to the child; contract.STUCK_STEP, STUCK_TIME). A supervisor whose task is not
behind (or that cannot read a peer: being ended) leaves it to that task's supervisor, and ends its own
task too only if the step is still frozen DEFER_BOUNDS bounds later.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import contract

STALL_ENV = "SUPERVISE_STALL"
DEFER_BOUNDS = 2.0
"""A task not behind waits this many stall bounds for the named task's end to fail its collective (the
peers notice within the heartbeat timeout) before it ends itself."""


@dataclass(frozen=True)
class StallBound:
    """How long a step may stand still: `multiple` x the p99 step, within [floor, ceiling] seconds."""

    multiple: float = 20.0
    floor: float = 60.0
    ceiling: float = 900.0

    def seconds(self, p99: float | None) -> float:
        return self.ceiling if p99 is None else min(self.ceiling, max(self.floor, self.multiple * p99))

    def describe(self, p99: float | None) -> str:
        measured = f"{self.multiple:g} x p99 step {p99:.3g}s" if p99 is not None else "no step time yet"
        return f"{self.seconds(p99):.0f}s: {measured}, floor {self.floor:g}s, ceiling {self.ceiling:g}s"

    @classmethod
    def parse(cls, text: str) -> StallBound | None:
        """`multiple,floor,ceiling`; "0": never (None)."""
        if text.strip() == "0":
            return None
        try:
            multiple, floor, ceiling = (float(x) for x in text.split(","))
        except ValueError:
            raise ValueError(
                f"{STALL_ENV}={text!r}: must be multiple,floor,ceiling (e.g. 20,60,900) or 0"
            ) from None
        if not 0 < floor <= ceiling or multiple <= 0:
            raise ValueError(f"{STALL_ENV}={text!r}: needs multiple > 0 and 0 < floor <= ceiling")
        return cls(multiple, floor, ceiling)


class StallWatch:
    """Is the step standing still for longer than the bound? Armed once it has advanced in this run
    (start-up, restore and tracing are the cluster timeout's business)."""

    def __init__(self, bound: StallBound | None, clock: Callable[[], float]) -> None:
        self._bound, self._clock = bound, clock
        self._step: int | None = None
        self._since = 0.0
        self._armed = False
        self._paused = False
        self.bound_s = 0.0
        """The bound of the last stall seen, seconds."""

    @property
    def step(self) -> int | None:
        return self._step

    def saw(self, step: int | None, p99_s: float | None) -> str:
        """ "" or why the step counts as stuck. A step of None (not training: saving, done; or no
        metrics) stops the clock: the frozen time counts from the next step seen."""
        if self._bound is None:
            return ""
        now = self._clock()
        if step is None:
            self._paused = True
            return ""
        if self._paused:
            self._paused, self._since = False, now
        if step != self._step:
            self._armed = self._step is not None
            self._step, self._since = step, now
            return ""
        still = now - self._since
        self.bound_s = self._bound.seconds(p99_s)
        if self._armed and still > self.bound_s:
            return f"step stuck at {step} for {still:.0f}s (bound {self._bound.describe(p99_s)})"
        return ""


def behind(inputs: Mapping[str, int | None]) -> tuple[str, ...]:
    """The tasks whose input step is below another task's (unknown ones ignored); () when nobody is:
    in a stuck job those never took the batch that their peers are all-reducing."""
    known = {t: s for t, s in inputs.items() if s is not None}
    if len(set(known.values())) < 2:
        return ()
    low = min(known.values())
    return tuple(sorted((t for t, s in known.items() if s == low), key=contract.task_order))
