"""The job's own step split, what the current settings' trial is held against: a trial that runs where
the job runs should step as the job did (the same image, links and limits). From Prometheus: the job's
chief over its last minutes before the tune (the `task:…1m` recording rules), the trial's from its turns
(table.Row). Says how close they came, in one line of the table and in tune.json."""

from __future__ import annotations

import math
from dataclasses import dataclass

import contract as c
from monitoring.prom.client import Prometheus
from monitoring.rules import recording as rules

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
    """The job's chief's split over LOOKBACK (the tune reads it before pausing the job); None when
    Prometheus has none (a job younger than a minute)."""
    share = rules.SHARE[c.ALLREDUCE] + selector
    got = {
        "step": _chief(prom, f"avg_over_time({rules.MEAN[c.STEP]}{selector}[{LOOKBACK}])"),
        "share": _chief(prom, f"avg_over_time({share}[{LOOKBACK}])"),
        "low": _chief(prom, f"min_over_time({share}[{LOOKBACK}])"),
        "high": _chief(prom, f"max_over_time({share}[{LOOKBACK}])"),
    }
    if any(v is None for v in got.values()):
        return None
    return Split(1e3 * got["step"], got["share"], got["low"], got["high"])


def _chief(prom: Prometheus, expr: str) -> float | None:
    for s in prom.query(expr):
        if c.task_of(s["metric"]) == c.CHIEF and math.isfinite(float(s["value"][1])):
            return float(s["value"][1])
    return None


def trial_share(split_ms: dict[str, float]) -> float:
    """A trial's all-reduce share from its row's medians (ms)."""
    step = split_ms.get("step", math.nan)
    return split_ms.get("all-reduce", math.nan) / step if step and math.isfinite(step) else math.nan
