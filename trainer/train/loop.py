"""The host side of training: one `Controller` runs the step functions until --steps.

Like orbit's `Controller` (tensorflow/models, orbit/controller.py) it owns the step functions, the
checkpoints and the metrics, and runs a tuple of actions after each call (`train_actions` there):
here the progress lines and the preemption check. Per call: run n steps, record every step's
metrics, run the actions, then save when the next save's step is reached (`SaveSchedule`: every
--save-every steps and every --save-seconds, whichever comes first). A save is a collective, so every
task must save at the same step: the seconds are turned into steps from the rate the tasks agree on.

The whole step is timed on the host between consecutive step ends (same clock as tf.timestamp(),
both are Unix time), so step - (input + compute + all-reduce) is the dispatch and host-loop
remainder, reported rather than hidden. Saving is kept out of the next step (the clock restarts
after a save); the after-call actions (the progress line, the preemption check) are not: their few
host milliseconds land in the next call's first step, as `other`.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from trainer.core.timing import CallOutput, LoopResult, StepFns, StepTiming, StepWork

log = logging.getLogger(__name__)

Action = Callable[[CallOutput], None]
"""Runs after every call, before a save; raising stops the loop there (a preemption does)."""

# Auto steps per call: calls of about this long make dispatch a few percent of the step time
# (measured: ~3 ms per call plus ~0.15 ms per step in the loop, on 2 shared cores) while metrics
# still update a couple of times a second; slow (GPU) steps get 1 step per call.
AUTO_CALL_S = 0.5
MAX_STEPS_PER_CALL = 100
CALIBRATIONS = 2
"""Auto steps per call is sized twice: on the first timed call (one step), then on the first call of
that size, from its later half. The first call's step ran on a batch the input pipeline had prefetched
while the step function traced: with slow input it understates the steady step (a trial cluster of a
103 ms input-bound step measured ~17 ms: calls of 30 steps, 3.8 s, in which make tune's 1 s turns often
saw no call end and so no step at all)."""


@dataclass(frozen=True, kw_only=True)
class LoopSettings:
    task_name: str
    steps: int
    steps_per_call: int
    """0 = auto: calibrated on the first timed calls (CALIBRATIONS), each agreed across tasks."""
    measure_every: int
    save_every: int
    save_seconds: float = 0.0
    """Also save once this many seconds of training have passed since the last save; 0: by steps only."""
    local_examples: int
    """Examples this task's replicas process per step."""
    classify: bool
    record_ids: bool


class Checkpoints(Protocol):
    def save(self, step: int) -> None: ...


class StepMetrics(Protocol):
    def state(self, state: str) -> None: ...
    def save_blocked(self, seconds: float) -> None: ...
    def record_step(self, **step) -> None: ...


def call_size(step: int, per_call: int, s: LoopSettings, save_at: int | None = None) -> int:
    """Steps in the next call: up to per_call, never past a save (`save_at`, else the next --save-every
    boundary) or the end."""
    limits = [per_call, s.steps - step]
    if save_at is not None:
        limits.append(save_at - step)
    elif s.save_every:
        limits.append(s.save_every - step % s.save_every)
    return min(limits)


RESIZE_EVERY = 10
"""Saves chosen by --save-every re-size the --save-seconds interval one in this many times: each re-size
is an all-gather, which under load cost about as much as the asynchronous save itself."""


@dataclass
class SaveSchedule:
    """Where the next save is: the next --save-every boundary, or `seconds` after the last save turned
    into steps (`seconds_steps`, sized from the agreed rate), whichever is first. None: only at the end."""

    save_every: int
    seconds: float
    anchor: int
    """The step of the last save (or of the start)."""
    seconds_steps: int | None = None
    """--save-seconds in steps, once a rate is known (the first timed call, then each save)."""

    @property
    def next(self) -> int | None:
        found = []
        if self.save_every:
            found.append((self.anchor // self.save_every + 1) * self.save_every)
        if self.seconds and self.seconds_steps:
            found.append(self.anchor + self.seconds_steps)
        return min(found, default=None)

    saves: int = 0

    def resize_due(self, step: int) -> bool:
        """Whether the save just made at `step` re-sizes the seconds interval (an agreement, a collective):
        when the seconds chose this save, else every RESIZE_EVERY saves (a rate that fell a lot makes the
        seconds first again). Decided alike on every task: it reads only agreed figures."""
        self.saves += 1
        if not self.seconds:
            return False
        by_seconds = self.seconds_steps is not None and step == self.anchor + self.seconds_steps
        return by_seconds or self.saves % RESIZE_EVERY == 0

    def steps_for(self, step_seconds: float) -> int:
        """--save-seconds in steps at this many seconds per step (at least 1)."""
        return max(1, int(self.seconds / max(step_seconds, 1e-9)))


def auto_steps_per_call(step_seconds: float) -> int:
    return max(1, min(MAX_STEPS_PER_CALL, int(AUTO_CALL_S / max(step_seconds, 1e-6))))


def timings_of(marks, call_start: float, call_end: float) -> list[StepTiming]:
    """Per step of one call; rows are (t_start, t0, t1, t2, t3) on the Unix clock.

    A step runs from the previous step's t3 to its own; the first starts at the host's previous
    return and the last ends at this return, so the steps add up to the wall time of the call.
    """
    out = []
    for i, (t_start, t0, t1, t2, t3) in enumerate(marks):
        begin = call_start if i == 0 else marks[i - 1][4]
        end = call_end if i == len(marks) - 1 else t3
        out.append(
            StepTiming(step=end - begin, input=t0 - t_start, compute=(t1 - t0) + (t3 - t2), allreduce=t2 - t1)
        )
    return out


@dataclass
class _Progress:
    """Where one `Controller.train` is: the step, the calls made, which functions have traced."""

    step: int
    per_call: int
    t_prev: float
    calls: int = 0
    traced: set = field(default_factory=set)
    calibrated: int = 0
    """Auto calibrations done (CALIBRATIONS)."""
    saves: SaveSchedule | None = None
    saved_time: float = 0.0
    """When the last save ended (or training started): the seconds interval's rate is measured from it."""


@dataclass(frozen=True, kw_only=True)
class Controller:
    """One task's training: the step functions, the checkpoints, the metrics and what runs after each
    call. `train` runs calls until --steps; `save` is also what a --save-every boundary does."""

    fns: StepFns
    checkpoints: Checkpoints
    metrics: StepMetrics
    settings: LoopSettings
    actions: tuple[Action, ...] = ()
    clock: Callable[[], float] = time.time
    agree: Callable[[int], int] = lambda k: k
    """Makes every task use the same auto steps per call (the cluster's maximum)."""

    def train(self, iterator, start_step: int) -> LoopResult:
        s = self.settings
        result = LoopResult(start_step=start_step, final_step=start_step)
        at = _Progress(step=start_step, per_call=s.steps_per_call or 1, t_prev=self.clock())
        at.saves = SaveSchedule(s.save_every, s.save_seconds, anchor=start_step)
        at.saved_time = at.t_prev
        while at.step < s.steps:
            out = self._call(iterator, at)
            self._record(out, result)
            for action in self.actions:
                action(out)
            if at.step == at.saves.next and at.step < s.steps:
                self.save(at.step)
                if at.saves.resize_due(at.step):
                    self._resize_seconds(at, (self.clock() - at.saved_time) / (at.step - at.saves.anchor))
                at.saves.anchor, at.saved_time = at.step, self.clock()
                at.t_prev = at.saved_time
        return result

    def save(self, step: int) -> None:
        """Hand a save to the checkpoints (asynchronous: back in milliseconds); its time on the step
        path is exported (trainer_checkpoint_blocked_seconds_total). The checkpoints report the step
        once it is durable."""
        self.metrics.state("checkpointing")
        began = self.clock()
        self.checkpoints.save(step)
        self.metrics.save_blocked(self.clock() - began)
        self.metrics.state("training")

    def _resize_seconds(self, at: _Progress, step_seconds: float) -> None:
        """--save-seconds in steps at `step_seconds` per step, the cluster's maximum (every task saves
        at the same step: the save is a collective)."""
        if self.settings.save_seconds:
            at.saves.seconds_steps = self.agree(at.saves.steps_for(step_seconds))

    def _call(self, iterator, at: _Progress) -> CallOutput:
        """One call of n steps; its first call per function traces (seconds) and is not timed."""
        n = call_size(at.step, at.per_call, self.settings, at.saves.next if at.saves else None)
        timed = at.calls % self.settings.measure_every == 0
        fn = self.fns.timed if timed else self.fns.plain
        marks, stats, ids = fn(iterator, n)
        stats, marks = stats.numpy(), marks.numpy()
        now = self.clock()
        at.calls += 1
        if timed and fn in at.traced:
            timings = timings_of(marks, at.t_prev, now)
            if at.saves is not None and at.saves.seconds_steps is None:  # the first rate known
                self._resize_seconds(at, statistics.median(t.step for t in timings))
            self._calibrate(at, timings)
        else:  # a function's first call traces it (seconds): not a step time anyone should alert on
            timings = [None] * n
            if fn not in at.traced:
                log.info(
                    "%s: traced the %s step function in %.1fs",
                    self.settings.task_name,
                    "timed" if timed else "untimed",
                    now - at.t_prev,
                )
            at.traced.add(fn)
        at.step, at.t_prev = at.step + n, now
        return CallOutput(
            step=at.step,
            timings=tuple(timings),
            loss=float(stats[0]),
            accuracy=float(stats[1]) if self.settings.classify else None,
            ids=ids.numpy() if self.settings.record_ids else None,
            now=now,
        )

    def _calibrate(self, at: _Progress, timings: list[StepTiming]) -> None:
        """--steps-per-call 0: size later calls from the first timed ones (CALIBRATIONS), from the median
        step of each one's later half (past the batches prefetched before it), agreed by every task."""
        if self.settings.steps_per_call or at.calibrated >= CALIBRATIONS:
            return
        at.calibrated += 1
        steady = statistics.median(t.step for t in timings[len(timings) // 2 :])
        at.per_call = self.agree(auto_steps_per_call(steady))
        log.info(
            "%s: %d steps per call (auto, ~%.0f ms each)",
            self.settings.task_name,
            at.per_call,
            1000 * AUTO_CALL_S,
        )

    def _record(self, out: CallOutput, result: LoopResult) -> None:
        result.loss, result.final_step, result.accuracy = out.loss, out.step, out.accuracy
        if out.ids is not None:
            result.ids.append(out.ids)
        first = out.step - out.steps
        work = StepWork(self.settings.local_examples, self.fns.allreduce_bytes)  # once per call, not per step
        for i, timing in enumerate(out.timings, start=1):
            self.metrics.record_step(
                step=first + i,
                loss=out.loss,
                work=work,
                now=out.now,
                timing=timing,
            )
