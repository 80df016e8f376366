"""`make tune`'s table and decision, from the trials' turns: pure, so unit tests pin them.

A round is `cycles` consecutive turns of every cluster; a cluster's rate in a round is its steps
between the readings ending its first and last turn of the round, over the time it ran between those
steps' ends (active_seconds). Each candidate's ratio is taken against the
current settings' rate in the same round; the null (the current settings again, a second cluster)
measures what the method itself moves."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from monitoring.tune import scrape


def active_seconds(turns: list[tuple[float, float]], start: float, stop: float) -> float:
    """Seconds of the turns (start, stop) that fall between start and stop."""
    return sum(max(0.0, min(b, stop) - max(a, start)) for a, b in turns)


CURRENT, NULL = "current", "current-again"


@dataclass(frozen=True)
class Row:
    name: str
    ratios: tuple[float, ...]
    """steps/s over the current settings', one per round."""
    steps_per_s: float
    examples_per_s: float
    split_ms: dict[str, float]
    """Median step and part times (ms) over the whole trial."""
    loss: float
    changes_optimisation: bool = False

    @property
    def median(self) -> float:
        return statistics.median(self.ratios) if self.ratios else math.nan


def round_rates(turns: list, cycles: int) -> list[float]:
    """A cluster's steps/s per round (rounds of `cycles` turns), from its turns' readings."""
    rates = []
    for i in range(0, len(turns) - cycles + 1, cycles):
        group = turns[i : i + cycles]
        a, b = group[0].reading, group[-1].reading
        spans = [(t.start, t.stop) for t in group]
        active = active_seconds(spans, a.ended, b.ended)
        if b.step > a.step and active > 0:
            rates.append((b.step - a.step) / active)
    return rates


def summary(name: str, turns: list, cycles: int, current_rates: list[float], changes: bool = False) -> Row:
    rates = round_rates(turns, cycles)
    ratios = tuple(r / c for r, c in zip(rates, current_rates, strict=False) if c > 0)
    first, last = turns[0].reading, turns[-1].reading
    split = {p: 1e3 * scrape.median_between(first.buckets[p], last.buckets[p]) for p in scrape.PARTS}
    steps = last.step - first.step
    # No examples counted (a script whose batch size is not static): not known, rather than 0 examples/s.
    counted = last.examples > first.examples
    per_step = (last.examples - first.examples) / steps if steps > 0 and counted else math.nan
    rate = statistics.median(rates) if rates else math.nan
    return Row(name, ratios, rate, rate * per_step, split, last.loss, changes)


def null_band(null: Row) -> tuple[float, float]:
    return (min(null.ratios), max(null.ratios)) if null.ratios else (math.nan, math.nan)


def bar(null: Row) -> float:
    """The ratio a winner's median must pass: 1 plus the null's widest miss of 1, either way. Which of two
    identical clusters runs faster is chance, so a null of 0.945-1.002 says the rounds err by 5.5 %; its
    highest alone (1.002) let an input-capped job's 1.003x through (2026-12-06)."""
    low, high = null_band(null)
    return 1 + max(abs(low - 1), abs(high - 1))


def winner(rows: list[Row], null: Row) -> Row | None:
    """The best candidate that beats the current settings beyond the null's spread: its median ratio
    above bar() and its lowest ratio above 1. None rather than a winner invented."""
    if not null.ratios:
        return None
    beating = [r for r in rows if r.ratios and r.median > bar(null) and min(r.ratios) > 1.0]
    return max(beating, key=lambda r: r.median, default=None)


def render(rows: list[Row], current: Row, null: Row, best: Row | None) -> str:
    head = f"{'candidate':<28} {'steps/s ratio (min-max)':>24} {'steps/s':>8} {'examples/s':>10}  {'step = compute + all-reduce + input (median ms)':<48} {'loss':>7}"
    lines = [head]

    def line(r: Row, ratio: str) -> str:
        s = r.split_ms
        split = f"{s['step']:.1f} = {s['compute']:.1f} + {s['all-reduce']:.1f} + {s['input wait']:.1f}"
        loss = f"{r.loss:.3f}" if r.changes_optimisation or r.name == CURRENT else ""
        examples = f"{r.examples_per_s:.0f}" if math.isfinite(r.examples_per_s) else "-"
        return f"{r.name:<28} {ratio:>24} {r.steps_per_s:>8.1f} {examples:>10}  {split:<48} {loss:>7}"

    lines.append(line(current, "1 (the reference)"))
    for r in [null, *rows]:
        ratio = f"{r.median:.3f} ({min(r.ratios):.3f}-{max(r.ratios):.3f})" if r.ratios else "no rounds"
        lines.append(line(r, ratio))
    low, high = null_band(null)
    lines.append(
        f"null (the current settings against themselves): {low:.3f}-{high:.3f} over {len(null.ratios)} rounds"
        + (f": a winner needs a median above {bar(null):.3f}" if null.ratios else "")
    )
    if best is None:
        lines.append(
            "no better setting found: no candidate beat the current settings beyond the null's spread"
        )
    else:
        lines.append(
            f"best: {best.name}: {best.median:.2f}x ({min(best.ratios):.2f}-{max(best.ratios):.2f}) the current steps/s, beyond the null's {low:.3f}-{high:.3f}"
        )
    return "\n".join(lines)
