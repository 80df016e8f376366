"""Which run the tools report on: the run named (make's RUN=, by default the id the project's last
`make up` wrote), else the project's latest run in Prometheus. Every trainer series carries the run
(contract.TARGET_LABELS), so an earlier run of the same stack never leaks into status, verdicts or
reports, and stays queryable by its id. Standard library only (`make status` runs without the venv)."""

from __future__ import annotations

import contract as c
from monitoring import rules
from monitoring.prom_client import Prometheus

LOOKBACK = "7d"
"""How far back a run is found by name or as the latest: longer than the default retention's time."""


def runs(prom: Prometheus, project: str, lookback: str = LOOKBACK) -> list[str]:
    """The project's runs that Prometheus holds, oldest first (run ids sort by their start time)."""
    expr = f"count by ({c.RUN_LABEL}) (last_over_time(up{rules.selector(project)}[{lookback}]))"
    return sorted(s["metric"][c.RUN_LABEL] for s in prom.query(expr) if s["metric"].get(c.RUN_LABEL))


def resolve(prom: Prometheus, project: str, run: str | None) -> str | None:
    """The run to report on: `run` when given, else the project's latest; None when it has none."""
    if run:
        return run
    known = runs(prom, project)
    return known[-1] if known else None
