"""One progress line per task every --log-every steps, with fixed fields:

    worker-1 | step 120/1000 | 8.3 steps/s | 530 ex/s | loss 0.412 | acc 0.87 | 120 ms = compute 70 + allreduce 35 + input 15 + other 0 | eta 1m46s

`ex/s` is the global batch rate; the breakdown is the mean of the timed steps in the interval and
`other` is what the in-step marks do not cover (function dispatch and the host loop).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainer.core.timing import CallOutput, Interval

log = logging.getLogger(__name__)


def format_eta(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


@dataclass(frozen=True)
class Job:
    """What a progress line says about the whole run, besides the interval."""

    task: str
    total: int
    """The last step (--steps)."""
    global_batch: int


def line(job: Job, interval: Interval, out: CallOutput, now: float) -> str:
    elapsed = max(now - interval.start_time, 1e-9)
    rate = interval.steps / elapsed
    fields = [
        job.task,
        f"step {out.step}/{job.total}",
        f"{rate:.1f} steps/s",
        f"{rate * job.global_batch:.0f} ex/s",
        f"loss {out.loss:.3f}",
    ]
    if out.accuracy is not None:
        fields.append(f"acc {out.accuracy:.2f}")
    mean = interval.mean()
    if mean is not None:
        ms = lambda s: f"{s * 1000:.1f}"
        fields.append(
            f"{ms(mean.step)} ms = compute {ms(mean.compute)} + allreduce {ms(mean.allreduce)}"
            f" + input {ms(mean.input)} + other {ms(mean.other)}"
        )
    fields.append(f"eta {format_eta((job.total - out.step) / rate) if rate > 0 else '?'}")
    return " | ".join(fields)


class ProgressLog:
    """An action of the loop: logs a line when a call passes a multiple of `every`, and at the end."""

    def __init__(self, job: Job, every: int, clock: Callable[[], float] = time.time) -> None:
        self.job, self.every, self.clock = job, every, clock
        self.interval = Interval(clock())

    def __call__(self, out: CallOutput) -> None:
        self.interval.steps += out.steps
        self.interval.timings.extend(t for t in out.timings if t is not None)
        before = out.step - out.steps
        if out.step // self.every > before // self.every or out.step == self.job.total:
            log.info(line(self.job, self.interval, out, self.clock()))
            self.interval = Interval(self.clock())
