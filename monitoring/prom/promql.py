"""Grafana-side query handling the report and the live dashboard tests share, and finding the last
run in Prometheus' data. The HTTP client itself is monitoring/prom/client.py."""

import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import contract
from monitoring.prom.client import Prometheus, PrometheusError  # noqa: F401  (re-exported for callers)
from monitoring.rules import recording as rules

DASHBOARD_DIR = Path(__file__).resolve().parents[1] / "config" / "grafana" / "dashboards"


def substitute(
    expr: str, *, rate_interval: str, interval: str, range_: str = "1h", variables: dict[str, str]
) -> str:
    """What Grafana sends to Prometheus: its built-in intervals and dashboard variables replaced.
    Longest names first, so $task does not eat the start of $task_type."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__interval", interval)
    expr = expr.replace("$__range", range_)
    for name in sorted(variables, key=len, reverse=True):
        expr = re.sub(r"\$\{" + name + r"\}|\$" + name + r"\b", lambda _m, v=variables[name]: v, expr)
    return expr


@dataclass(frozen=True, kw_only=True)
class PanelQuery:
    dashboard: str
    """Dashboard uid."""
    panel: str
    """Panel title."""
    ref_id: str
    expr: str
    legend: str
    instant: bool
    repeat: str | None
    """Variable the panel repeats over, if any."""


def panel_queries(dashboard: dict) -> Iterator[PanelQuery]:
    """Every Prometheus target of every panel, rows included."""
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield PanelQuery(
                    dashboard=dashboard["uid"],
                    panel=inner.get("title", ""),
                    ref_id=target.get("refId", ""),
                    expr=target["expr"],
                    legend=target.get("legendFormat", ""),
                    instant=bool(target.get("instant")) and not target.get("range"),
                    repeat=inner.get("repeat"),
                )


def load_dashboards(directory: Path = DASHBOARD_DIR) -> dict[str, dict]:
    """Committed dashboard JSON by file name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


# --- The current or last run, found from the data itself ---


def presence(sel: str = rules.JOB_SELECTOR) -> str:
    return f"count({contract.GLOBAL_STEP.name}{sel})"


PRESENCE = presence()


@dataclass(frozen=True, kw_only=True)
class Window:
    start: float
    end: float
    step: float


def last_run(timestamps: list[float], *, gap: float) -> tuple[float, float] | None:
    """The last stretch of timestamps with no hole longer than gap: the current or last run."""
    if not timestamps:
        return None
    ts = sorted(timestamps)
    start = ts[-1]
    for earlier, later in zip(reversed(ts[:-1]), reversed(ts[1:]), strict=True):
        if later - earlier > gap:
            break
        start = earlier
    return start, ts[-1]


def find_window(
    prom: Prometheus, *, lookback: float, now: float, points: int = 400, sel: str = rules.JOB_SELECTOR
) -> Window | None:
    """The last run's stretch of time among the series `sel` selects (rules.selector: one run's)."""
    scan_step = max(5.0, lookback / 10_000)  # Prometheus answers at most 11,000 points per series
    matrix = prom.query_range(presence(sel), now - lookback, now, scan_step)
    run = last_run([float(t) for s in matrix for t, _ in s["values"]], gap=max(60.0, 3 * scan_step))
    if run is None:
        return None
    start, end = run
    return Window(start=start, end=end, step=max(5.0, round((end - start) / points)))


def finite_series(result: list[dict]) -> dict[str, dict]:
    """instance → labels of the series (vector or matrix) that have at least one finite value."""
    out = {}
    for series in result:
        values = series.get("values") or [series["value"]]
        if any(math.isfinite(float(v)) for _, v in values):
            out[series["metric"].get("instance", "")] = series["metric"]
    return out


def wait_for_data(
    prom: Prometheus, expr: str, *, tasks: int, timeout: float, lookback: float = 3600
) -> Window:
    """Poll until expr has a finite value for `tasks` tasks in the last run; its window. Prometheus
    offers nothing to block on, so this polls at the scrape interval."""
    deadline = time.monotonic() + timeout
    while True:
        window = find_window(prom, lookback=lookback, now=time.time())
        if window is not None:
            if len(finite_series(prom.query_range(expr, window.start, window.end + 60, 5))) >= tasks:
                return window
        if time.monotonic() > deadline:
            raise TimeoutError(f"{expr} has no data for {tasks} tasks after {timeout:.0f} s")
        time.sleep(5)
