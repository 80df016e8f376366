"""The host side of training: run steps until --steps, record metrics, log, checkpoint.

The whole step is timed on the host between consecutive step ends (same clock as tf.timestamp(),
both are Unix time), so step - (input + compute + all-reduce) is the dispatch and host-loop
remainder, reported rather than hidden. Saving and logging are excluded from the next step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from trainer import progress
from trainer.metrics import StepTiming

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepFns:
    timed: Callable
    """(iterator, n) -> marks [n, 5] (t_start, t0..t3 of replica 0), stats [loss, accuracy], ids"""
    plain: Callable
    """(iterator, n) -> the same arithmetic without marks (marks is then [n, 0])"""
    allreduce_bytes: int
    """Gradient bytes each replica all-reduces per step."""


@dataclass
class LoopResult:
    start_step: int
    final_step: int
    loss: float = float("nan")
    accuracy: float | None = None
    ids: list[np.ndarray] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class LoopSettings:
    task_name: str
    steps: int
    steps_per_call: int
    measure_every: int
    log_every: int
    save_every: int
    global_batch: int
    local_examples: int
    """Examples this task's replicas process per step."""
    classify: bool
    record_ids: bool


# Auto steps per call: calls of about this long make dispatch a few percent of the step time
# (measured: ~3 ms per call plus ~0.15 ms per step in the loop, on 2 shared cores) while metrics
# still update a couple of times a second; slow (GPU) steps get 1 step per call.
AUTO_CALL_S = 0.5
MAX_STEPS_PER_CALL = 100


def call_size(step: int, per_call: int, s: LoopSettings) -> int:
    """Steps in the next call: up to per_call, never past a save or the end."""
    limits = [per_call, s.steps - step]
    if s.save_every:
        limits.append(s.save_every - step % s.save_every)
    return min(limits)


def auto_steps_per_call(step_seconds: float) -> int:
    return max(1, min(MAX_STEPS_PER_CALL, int(AUTO_CALL_S / max(step_seconds, 1e-6))))


def train(fns: StepFns, iterator, *, start_step: int, settings: LoopSettings, metrics,
          save: Callable[[int], None], clock: Callable[[], float] = time.time,
          agree: Callable[[int], int] = lambda k: k,
          after_call: Callable[[int], None] = lambda step: None) -> LoopResult:
    """`agree` makes every task use the same auto steps per call (the cluster's maximum);
    `after_call(step)` runs at every call boundary (where a preemption may save and exit)."""
    result = LoopResult(start_step=start_step, final_step=start_step)
    step, calls, traced = start_step, 0, set()
    per_call = settings.steps_per_call or 1  # 0 = auto: calibrated on the first timed call
    interval = progress.Interval(clock())
    t_prev = clock()
    while step < settings.steps:
        n = call_size(step, per_call, settings)
        timed = calls % settings.measure_every == 0
        fn = fns.timed if timed else fns.plain
        marks, stats, ids = fn(iterator, n)
        stats, marks = stats.numpy(), marks.numpy()
        now = clock()
        calls += 1
        if timed and fn in traced:
            timings = timings_of(marks, t_prev, now)
            if settings.steps_per_call == 0:
                per_call = agree(auto_steps_per_call(sum(t.step for t in timings) / n))
                log.info("%s: %d steps per call (auto, ~%.0f ms each)", settings.task_name, per_call,
                         1000 * AUTO_CALL_S)
                settings = replace(settings, steps_per_call=per_call)
        else:  # a function's first call traces it (seconds): not a step time anyone should alert on
            timings = [None] * n
            if fn not in traced:
                log.info("%s: traced the %s step function in %.1fs", settings.task_name,
                         "timed" if timed else "untimed", now - t_prev)
            traced.add(fn)
        result.loss, result.final_step = float(stats[0]), step + n
        result.accuracy = float(stats[1]) if settings.classify else None
        if settings.record_ids:
            result.ids.append(ids.numpy())
        for timing in timings:
            step += 1
            metrics.record_step(step=step, loss=result.loss, examples=settings.local_examples,
                                allreduce_bytes=fns.allreduce_bytes, now=now, timing=timing)
        interval.steps += n
        interval.timings.extend(t for t in timings if t is not None)
        t_prev = now
        if step // settings.log_every > (step - n) // settings.log_every or step == settings.steps:
            log.info(progress.line(task=settings.task_name, step=step, total=settings.steps, interval=interval,
                                   now=clock(), global_batch=settings.global_batch, loss=result.loss,
                                   accuracy=result.accuracy))
            interval = progress.Interval(clock())
        after_call(step)
        if settings.save_every and step % settings.save_every == 0 and step < settings.steps:
            save(step)
            t_prev = clock()
    return result


def timings_of(marks, call_start: float, call_end: float) -> list[StepTiming]:
    """Per step of one call; rows are (t_start, t0, t1, t2, t3) on the Unix clock.

    A step runs from the previous step's t3 to its own; the first starts at the host's previous
    return and the last ends at this return, so the steps add up to the wall time of the call.
    """
    out = []
    for i, (t_start, t0, t1, t2, t3) in enumerate(marks):
        begin = call_start if i == 0 else marks[i - 1][4]
        end = call_end if i == len(marks) - 1 else t3
        out.append(StepTiming(step=end - begin, input=t0 - t_start, compute=(t1 - t0) + (t3 - t2),
                              allreduce=t2 - t1))
    return out
