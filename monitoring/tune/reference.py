"""The job's own step split, what the current settings' trial is held against: a trial that runs where
the job runs should step as the job did (the same image, links and limits). From Prometheus: the job's
chief over its last minutes before the tune (medians from its histograms, as the table's are), the trial's from its turns
(table.Row). Says how close they came, in one line of the table and in tune.json."""

from __future__ import annotations

import math
from dataclasses import dataclass

import contract as c
from monitoring.prom.client import Prometheus

LOOKBACK = "3m"
"""The job's last minutes the reference spans: three of the rules' one-minute windows."""


@dataclass(frozen=True)
class Split:
    """The job's chief: its mean step (ms) and all-reduce share over LOOKBACK, with the share's range
    over the one-minute windows in it (the job's own spread)."""

    step_ms: float
    allreduce: float
    low: float
    high: float

    def line(self, trial_step_ms: float, trial_allreduce: float) -> str:
        """How close the current settings' trial came to the job: `job 64.0 ms = 79 % all-reduce (77-83 %
        over its last 3m); current trial 61.0 ms = 77 %: inside the job's range`."""
        job = (f"the job's chief over its last {LOOKBACK}: {self.step_ms:.1f} ms = {_pct(self.allreduce)} "
               f"all-reduce ({100 * self.low:.0f}-{_pct(self.high)})")  # fmt: skip
        if not math.isfinite(trial_allreduce):
            return f"step split: {job}; the current settings' trial: not measured"
        off = self.miss(trial_allreduce)
        where = "inside the job's range" if off == 0 else f"{100 * off:.0f} points outside the job's range"
        return (f"step split: {job}; the current settings' trial {trial_step_ms:.1f} ms = "
                f"{_pct(trial_allreduce)} all-reduce: {where}")  # fmt: skip

    def miss(self, share: float) -> float:
        """How far `share` falls outside the job's range (0 inside it)."""
        return max(0.0, self.low - share, share - self.high)


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %" if math.isfinite(x) else "?"


def job_split(prom: Prometheus, selector: str) -> Split | None:
    """The job's chief's median step and all-reduce over LOOKBACK, from its histograms as the trial's
    row is (medians: a step a pause lands in moves the mean, not the median), with the share's range over
    the one-minute windows in it; read before the tune pauses the job. None when Prometheus has no step
    of the chief in it (a job that was restarting)."""
    minutes = int(LOOKBACK.rstrip("m"))
    step, allreduce = (
        _median(prom, c.STEP, selector, LOOKBACK),
        _median(prom, c.ALLREDUCE, selector, LOOKBACK),
    )
    shares = [_median(prom, c.ALLREDUCE, selector, "1m", m) / _median(prom, c.STEP, selector, "1m", m)
              for m in range(minutes)]  # fmt: skip
    shares = [x for x in shares if math.isfinite(x)]
    if not (math.isfinite(step) and math.isfinite(allreduce) and step > 0 and shares):
        return None
    return Split(1e3 * step, allreduce / step, min(shares), max(shares))


def _median(prom: Prometheus, metric: c.Metric, selector: str, window: str, minutes_ago: int = 0) -> float:
    """The chief's median of histogram `metric` over `window` ending `minutes_ago` minutes ago; nan when
    it observed nothing then."""
    offset = f" offset {minutes_ago}m" if minutes_ago else ""
    rate = f"rate({metric.name}_bucket{selector}[{window}]{offset})"
    expr = f"histogram_quantile(0.5, sum by (le, {c.TASK_TYPE}, {c.TASK_INDEX}) ({rate}))"
    for s in prom.query(expr):
        if c.task_of(s["metric"]) == c.CHIEF:
            return float(s["value"][1])
    return math.nan


def trial_share(split_ms: dict[str, float]) -> float:
    """A trial's all-reduce share from its row's medians (ms)."""
    step = split_ms.get("step", math.nan)
    return split_ms.get("all-reduce", math.nan) / step if step and math.isfinite(step) else math.nan
