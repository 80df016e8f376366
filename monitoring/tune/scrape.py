"""One reading of a trial chief's /metrics: the step, when it ended, the loss and the histograms of the
step and its parts. Pure parsing plus one HTTP GET."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

import contract as c

PARTS = {"step": c.STEP, "compute": c.COMPUTE, "all-reduce": c.ALLREDUCE, "input wait": c.INPUT_WAIT}


@dataclass(frozen=True)
class Reading:
    step: float
    """trainer_global_step."""
    ended: float
    """Unix time the last step ended (trainer_last_step_timestamp_seconds)."""
    loss: float
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)
    """Part -> upper bound -> cumulative count."""
    examples: float = 0.0


def parse(text: str) -> Reading:
    values: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {p: {} for p in PARTS}
    by_family = {m.name: p for p, m in PARTS.items()}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_bucket") and family.name in by_family:
                buckets[by_family[family.name]][float(s.labels["le"])] = s.value
            else:
                values[s.name] = s.value
    return Reading(
        step=values.get(c.GLOBAL_STEP.name, 0.0),
        ended=values.get(c.LAST_STEP_TIME.name, 0.0),
        loss=values.get(c.LOSS.name, float("nan")),
        buckets=buckets,
        examples=values.get(c.EXAMPLES.name, 0.0),
    )


def read(host: str, port: int, timeout: float = 5.0) -> Reading:
    """A trial chief's /metrics at its task's address on the job's network (reached from the host; no
    port of the host's own)."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as r:
        return parse(r.read().decode())


def median_between(a: dict[float, float], b: dict[float, float]) -> float:
    """The median of the observations made between two readings of a histogram's cumulative buckets,
    interpolated inside its bucket (as histogram_quantile does). A median, because the one step a
    SIGSTOP lands in lasts the whole pause: it moves the mean, not the median."""
    bounds = sorted(b)
    counts = [b[u] - a.get(u, 0.0) for u in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return float("nan")
    half, lower, below = total / 2, 0.0, 0.0
    for upper, count in zip(bounds, counts, strict=True):
        if count >= half:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (half - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return lower
