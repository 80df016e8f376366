"""A run's steady part and the spread of a figure over it: the statistics of `make compare` and
`make tune`, pure (no Prometheus, no clock), so unit tests pin them.

A figure's spread is its interquartile range over the samples (windows of a run, rounds of a tune):
on these machines the same work runs 10-40 % faster or slower from one minute to the next, so one
number per run hides whether a difference is the change or the machine. Two figures differ *beyond
the spread* when their ranges do not overlap."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

SKIP_S = 60.0
"""Seconds after a run's first step left out of its steady part: tracing, the warm-up of the learning
rate and the first checkpoints (`make compare` says so; COMPARE_SKIP= to change it)."""


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    """25th percentile."""
    high: float
    """75th percentile."""
    n: int

    def scaled(self, factor: float) -> Spread:
        return Spread(self.median * factor, self.low * factor, self.high * factor, self.n)

    def inverse(self, numerator: float = 1.0) -> Spread:
        """numerator / x: a step time's spread as a rate's (the bounds swap)."""
        return Spread(numerator / self.median, numerator / self.high, numerator / self.low, self.n)


def spread(values: Sequence[float]) -> Spread:
    """Median and interquartile range; one value is its own range. Raises ValueError on none."""
    if not values:
        raise ValueError("no samples")
    xs = sorted(values)
    if len(xs) == 1:
        return Spread(xs[0], xs[0], xs[0], 1)
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return Spread(statistics.median(xs), q1, q3, len(xs))


def steady(samples: Sequence[tuple[float, float]], first_step: float, skip: float = SKIP_S) -> list[float]:
    """The values of (time, value) samples at least `skip` seconds after the run's first step."""
    return [v for t, v in samples if t >= first_step + skip]


def compare(new: Spread, old: Spread) -> int:
    """+1: new is higher beyond the spread (its range wholly above old's), -1 lower, 0 no difference."""
    if new.low > old.high:
        return 1
    if new.high < old.low:
        return -1
    return 0


def ratio(new: Spread, old: Spread) -> Spread:
    """new / old: the ratio of the medians, bounded by the ratios of the ranges' far ends."""
    return Spread(new.median / old.median, new.low / old.high, new.high / old.low, min(new.n, old.n))
