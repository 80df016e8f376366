"""How often `make compare`'s rule calls a difference between two identical runs, derived from the rule
itself (steady.spread and steady.compare), never typed: each side's windows drawn from one and the same
distribution, seeded, and the share of draws in which the two interquartile ranges miss each other.

Measured so (10,000 draws a count, 2026-12-07): 57 % at 2 windows a side, 25 % at 4, 13 % at 6,
6.3 % at 8, 5.9 % at 9, 3.4 % at 10, 1.1 % at 14; normal draws gave 59 % at 2 and 23 % at 4. The
rate hardly depends on the distribution (normal, uniform, log-normal, exponential agree within the
draws' noise: tests/unit/test_compare_stats.py), but it falls unevenly: the quartiles interpolate
between windows, so 4 and 5, 8 and 9, 12 and 13 windows miss about as often. `minimum` is the fewest
windows from which every count checked keeps the rate at LIMIT or below; more windows on one side only
lower it. What it does not cover: windows of one run are not independent, and the machine
drifts between runs (make compare says so every time)."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass

from monitoring.verdicts import steady

LIMIT = 0.05
"""The chance rate `make compare` accepts: it refuses fewer windows a side than keep it at or below."""
TRIALS = 10_000
"""Draws per window count: a rate near LIMIT is known to about +-0.2 points."""
SEED = 47
CHECKED = 4
"""`minimum` checks this many counts past the first that meets LIMIT: the quartiles' interpolation
repeats every 4 windows, so a count past them that met it by chance would show."""

MOST = 100
"""The most windows a side `minimum` tries (25 minutes of 15 s windows) before it calls a rule unusable."""

Draw = Callable[[random.Random], float]


def uniform(rng: random.Random) -> float:
    return rng.random()


@functools.cache
def rate(n_old: int, n_new: int, trials: int = TRIALS, draw: Draw = uniform) -> float:
    """The share of `trials` pairs of identical runs (n_old and n_new windows, every window one draw)
    that steady.compare calls different: the rule's false-difference rate at those counts."""
    rng = random.Random(f"{SEED}/{n_old}/{n_new}/{trials}")
    hits = 0
    for _ in range(trials):
        old = steady.spread([draw(rng) for _ in range(n_old)])
        new = steady.spread([draw(rng) for _ in range(n_new)])
        hits += steady.compare(new, old) != 0
    return hits / trials


@functools.cache
def minimum(limit: float = LIMIT, trials: int = TRIALS, draw: Draw = uniform) -> int:
    """The fewest windows a side from which the rule's chance rate stays at `limit` or below (for that
    count and the CHECKED counts after it)."""
    for n in range(2, MOST + 1):
        if all(rate(m, m, trials, draw) <= limit for m in range(n, n + CHECKED + 1)):
            return n
    raise ValueError(
        f"the rule calls a difference between identical runs more than {limit:.0%} up to {MOST} windows"
    )


CAP = 4
"""Beyond CAP x minimum windows a side the rate is stated as the one at that many: an upper bound (more
draws would only cost time; at 40 windows a side none of 10,000 pairs differed)."""


@dataclass(frozen=True)
class Chance:
    """What `make compare` states: the rule's rate between identical runs at the runs' window counts."""

    rate: float
    windows: int
    """Windows a side the rate is at: the shorter run's (a longer other side only lowers it), at most
    CAP x minimum."""
    minimum: int
    """The fewest windows a side compare accepts (`minimum()`)."""
    capped: bool
    """The shorter run has more than CAP x minimum windows: the rate is the one at that many, a bound."""

    def text(self) -> str:
        pct = (
            f"{100 * self.rate:.1f} %" if self.rate else f"under {100 / TRIALS:g} % (none of {TRIALS} draws)"
        )
        bound = "at most " if self.capped and self.rate else ""
        more = " (more windows only lower it)" if self.capped else ""
        return f"a difference this rule calls between identical runs: {bound}{pct} at {self.windows} windows a side{more}"


def of(n_old: int, n_new: int) -> Chance:
    least = minimum()
    n = min(n_old, n_new)
    capped = n > CAP * least
    n = CAP * least if capped else n
    return Chance(rate(n, n), n, least, capped)


POWER = 0.8
"""How often a change must be called to count as one the rule sees."""
POWER_TRIALS = 2_000


def called(n_old: int, n_new: int, shift: float, trials: int = POWER_TRIALS, draw: Draw = uniform) -> float:
    """The share of pairs the rule calls different when every new window is moved by `shift` times the
    windows' interquartile range (uniform draws: theirs is 0.5)."""
    rng = random.Random(f"{SEED}/{n_old}/{n_new}/{shift}/{trials}")
    hits = 0
    for _ in range(trials):
        old = steady.spread([draw(rng) for _ in range(n_old)])
        new = steady.spread([draw(rng) + 0.5 * shift for _ in range(n_new)])
        hits += steady.compare(new, old) != 0
    return hits / trials


@functools.cache
def visible(n_old: int, n_new: int, power: float = POWER) -> float:
    """The smallest move, in interquartile ranges of the windows, that the rule calls `power` of the
    time at these counts (to 0.05 of a range)."""
    low, high = 0.0, 8.0
    while high - low > 0.05:
        mid = (low + high) / 2
        low, high = (low, mid) if called(n_old, n_new, mid) >= power else (mid, high)
    return high
