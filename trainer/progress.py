"""One progress line per task every --log-every steps, with fixed fields:

    worker-1 | step 120/1000 | 8.3 steps/s | 530 ex/s | loss 0.412 | acc 0.87 | 120 ms = compute 70 + allreduce 35 + input 15 + other 0 | eta 1m46s

`ex/s` is the global batch rate; the breakdown is the mean of the timed steps in the interval and
`other` is what the in-step marks do not cover (function dispatch and the host loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainer.metrics import StepTiming


def format_eta(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


@dataclass
class Interval:
    """Accumulates steps between two progress lines."""

    start_time: float
    steps: int = 0
    timings: list[StepTiming] = field(default_factory=list)

    def mean(self) -> StepTiming | None:
        if not self.timings:
            return None
        n = len(self.timings)
        return StepTiming(step=sum(t.step for t in self.timings) / n, input=sum(t.input for t in self.timings) / n,
                          compute=sum(t.compute for t in self.timings) / n,
                          allreduce=sum(t.allreduce for t in self.timings) / n)


def line(*, task: str, step: int, total: int, interval: Interval, now: float, global_batch: int,
         loss: float, accuracy: float | None) -> str:
    elapsed = max(now - interval.start_time, 1e-9)
    rate = interval.steps / elapsed
    fields = [task, f"step {step}/{total}", f"{rate:.1f} steps/s", f"{rate * global_batch:.0f} ex/s",
              f"loss {loss:.3f}"]
    if accuracy is not None:
        fields.append(f"acc {accuracy:.2f}")
    mean = interval.mean()
    if mean is not None:
        ms = lambda s: f"{s * 1000:.1f}"
        fields.append(f"{ms(mean.step)} ms = compute {ms(mean.compute)} + allreduce {ms(mean.allreduce)}"
                      f" + input {ms(mean.input)} + other {ms(mean.other)}")
    fields.append(f"eta {format_eta((total - step) / rate) if rate > 0 else '?'}")
    return " | ".join(fields)
