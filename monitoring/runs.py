"""`make runs`: the project's runs Prometheus still holds, which `make compare` can compare: id, first
and last step's time, steps, tasks, and the settings each recorded at start (contract.RUN_SETTINGS);
and which run the other tools report on (`resolve`): the run named (make's RUN=, by default the id
the project's last `make up` wrote), else the project's latest run in Prometheus. Every trainer
series carries the run (contract.TARGET_LABELS), so an earlier run of the same stack never leaks into
status, verdicts or reports, and stays queryable by its id. Standard library only (`make status` and
`make runs` run without the venv).

    python -m monitoring.runs [--prometheus URL] [--project P] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

import contract as c
from monitoring.prom.client import DEFAULT_URL, Prometheus, PrometheusError
from monitoring.rules import recording as rules

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


@dataclass(frozen=True)
class Run:
    id: str
    first_step: float
    """Unix time of the first step any task finished."""
    last_step: float
    steps: int
    """The highest global step any task reached."""
    tasks: int
    settings: dict[str, str] = field(default_factory=dict)
    """The chief's RUN_SETTINGS labels (another task's when the chief recorded none)."""


def _by_run(prom: Prometheus, expr: str) -> dict[str, float]:
    return {
        s["metric"][c.RUN_LABEL]: float(s["value"][1]) for s in prom.query(expr) if c.RUN_LABEL in s["metric"]
    }


def settings(prom: Prometheus, sel: str, lookback: str = LOOKBACK) -> dict[str, dict[str, str]]:
    """Run id -> the settings it recorded, the chief's first."""
    found: dict[str, dict[str, str]] = {}
    series = prom.query(f"last_over_time({c.exposed_name(c.RUN_SETTINGS)}{sel}[{lookback}])")
    for s in sorted(series, key=lambda s: c.task_order(c.task_of(s["metric"])), reverse=True):
        found[s["metric"][c.RUN_LABEL]] = {k: s["metric"].get(k, "") for k in c.RUN_SETTING_LABELS}
    return found


def first_steps(prom: Prometheus, sel: str, lookback: str = LOOKBACK) -> dict[str, float]:
    """Run id -> Unix time of its first step. The gauge reads 0 before a process's first step, so the
    minimum is over its positive values: a subquery, first at one-minute resolution over the lookback
    (cheap), then at one second over the two minutes up to that coarse answer."""

    def earliest(run_sel: str, span: str, resolution: str, at: float | None = None) -> dict[str, float]:
        expr = f"min by ({c.RUN_LABEL}) (min_over_time(({c.LAST_STEP_TIME.name}{run_sel} > 0)[{span}:{resolution}]))"
        return {s["metric"][c.RUN_LABEL]: float(s["value"][1]) for s in prom.query(expr, at)}

    coarse = earliest(sel, lookback, "1m")
    fine = {}
    for run, t in coarse.items():
        run_sel = sel[:-1] + f', {c.RUN_LABEL}="{run}"}}'
        fine[run] = min(earliest(run_sel, "2m", "1s", at=t + 60).get(run, t), t)
    return fine


def describe(prom: Prometheus, project: str, lookback: str = LOOKBACK) -> list[Run]:
    """The project's runs with at least one step, oldest first."""
    sel = rules.selector(project)
    stamp = f"{c.LAST_STEP_TIME.name}{sel}[{lookback}]"
    first = first_steps(prom, sel, lookback)
    last = _by_run(prom, f"max by ({c.RUN_LABEL}) (max_over_time({stamp}))")
    steps = _by_run(prom, f"max by ({c.RUN_LABEL}) (max_over_time({c.GLOBAL_STEP.name}{sel}[{lookback}]))")
    tasks = _by_run(prom, f"count by ({c.RUN_LABEL}) (max_over_time({c.STEPS.name}{sel}[{lookback}]) > 0)")
    recorded = settings(prom, sel, lookback)
    return [
        Run(
            r,
            first[r],
            last.get(r, first[r]),
            int(steps.get(r, 0)),
            int(tasks.get(r, 0)),
            recorded.get(r, {}),
        )
        for r in sorted(first)
    ]


def find(known: list[Run], run_id: str) -> Run | None:
    return next((r for r in known if r.id == run_id), None)


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def render(known: list[Run], project: str) -> str:
    if not known:
        return f"runs: project {project} has no run with a step in Prometheus (last {LOOKBACK})"
    lines = [f"{'run':<18}  {'first step (UTC)':<19}  {'lasted':>7}  {'steps':>6}  tasks  settings"]
    for r in known:
        given = " ".join(f"{k}={v}" for k, v in r.settings.items() if v) or "(none recorded)"
        lasted = f"{r.last_step - r.first_step:.0f} s"
        lines.append(
            f"{r.id:<18}  {_clock(r.first_step):<19}  {lasted:>7}  {r.steps:>6}  {r.tasks:>5}  {given}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m monitoring.runs", description=__doc__.splitlines()[0])
    p.add_argument("--prometheus", default=os.environ.get("PROMETHEUS_URL", DEFAULT_URL))
    p.add_argument("--project", default=c.DEFAULT_PROJECT)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        known = describe(Prometheus(url=args.prometheus, timeout=10.0), args.project)
    except PrometheusError as err:
        print(f"runs: cannot query Prometheus at {args.prometheus}: {err}", file=sys.stderr)
        return 2
    print(json.dumps([asdict(r) for r in known], indent=2) if args.json else render(known, args.project))
    return 0 if known else 2


if __name__ == "__main__":
    sys.exit(main())
