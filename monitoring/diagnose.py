"""`make diagnose`: the cluster's bottleneck from Prometheus, with evidence and advice.

    python -m monitoring.diagnose [--prometheus URL] [--project P] [--run ID] [--bench FILE] [--json]

Reads the task-level recording rules (1 minute windows) and the targets, states and build info of
the last few minutes, of one run only (--run, by default the project's latest: monitoring/runs.py;
an earlier run's tasks in the same Prometheus are not this run's), then judges with monitoring/verdicts/verdict.py (which the dashboard's generated rules
implement in PromQL). Exit 0 healthy (or finished), 1 a problem, 2 no data.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path

import contract as c
from contract.benchcomm import Result, ResultError
from monitoring import runs
from monitoring.prom.client import DEFAULT_URL, Prometheus, PrometheusError
from monitoring.rules import recording as rules
from monitoring.verdicts import measured, verdict

LOOKBACK = "5m"
"""How far back a target, state or build counts: a task that vanished minutes ago is still named."""


def queries(sel: str = rules.JOB_SELECTOR) -> dict[str, str]:
    """Name -> PromQL over the series `sel` selects (rules.selector: one project's run)."""

    def recent(series: str, lookback: str = LOOKBACK) -> str:
        return f"last_over_time({series}{sel}[{lookback}])"

    return {
        "up": recent("up"),
        "state": f"{recent(c.STATE.name, rules.RUN_LOOKBACK)} == 1",
        "last_step_age": rules.LAST_STEP_AGE + sel,
        "step": rules.MEAN[c.STEP] + sel,
        "compute": rules.MEAN[c.COMPUTE] + sel,
        "compute_share": rules.SHARE[c.COMPUTE] + sel,
        "allreduce_share": rules.SHARE[c.ALLREDUCE] + sel,
        "input_share": rules.SHARE[c.INPUT_WAIT] + sel,
        "busbw": rules.BUSBW + sel,
        "build": recent(rules.BUILD_INFO),
        "world_size": recent(c.WORLD_SIZE.name),
        "allreduce_bytes": rules.BYTES_PER_STEP + sel,
        "stuck_step": recent(c.STUCK_STEP.name, rules.RUN_LOOKBACK),
        "stuck_age": f"time() - {recent(c.STUCK_TIME.name, rules.RUN_LOOKBACK)}",
    }


QUERIES = queries()
"""Over every run (what the run's selector narrows)."""
NUMBERS = (
    "last_step_age",
    "step",
    "compute",
    "compute_share",
    "allreduce_share",
    "input_share",
    "busbw",
    "stuck_age",
)


def _number(value: str) -> float | None:
    x = float(value)
    return x if math.isfinite(x) else None


def _field(name: str, series: dict) -> tuple[str, object] | None:
    """The TaskSample field one query result gives, None for results that are not per-task fields."""
    labels, value = series["metric"], series["value"][1]
    if name == "state":
        return "state", labels.get(c.STATE.client_name)
    if name == "build":
        return "build", tuple(labels.get(k, "") for k in c.BUILD_LABELS)
    if name in ("world_size", "stuck_step"):
        return name, int(float(value))
    return (name, _number(value)) if name in NUMBERS else None


def samples(results: dict[str, list[dict]]) -> list[verdict.TaskSample]:
    """TaskSamples from instant-query results (name in QUERIES -> Prometheus vector). Pure."""
    fields = {c.task_of(s["metric"]): {"up": float(s["value"][1]) == 1} for s in results.get("up", [])}
    for name, vector in results.items():
        for s in vector:
            task, field = c.task_of(s["metric"]), _field(name, s)
            if task in fields and field is not None:  # else a series of a task no longer scraped
                fields[task][field[0]] = field[1]
    return [verdict.TaskSample(task=t, **fields[t]) for t in sorted(fields, key=c.task_order)]


def link_reference(path: Path, gradient_bytes: float | None) -> tuple[float | None, int | None]:
    """From `make bench-comm`'s result (if it has run): the best busbw (bytes/s) at the size nearest
    the training's bytes per all-reduce, and that size; else its overall best."""
    try:
        return Result.read(path).reference(gradient_bytes)
    except FileNotFoundError:
        return None, None
    except (OSError, ResultError) as err:
        print(f"diagnose: ignoring the bench-comm result: {err}", file=sys.stderr)
        return None, None


def render(d: verdict.Diagnosis) -> str:
    cl = d.cluster
    lines = [f"cluster: {cl.verdict.upper()}" + (f" ({', '.join(cl.tasks)})" if cl.tasks else "")]
    lines += [f"  - {e}" for e in cl.evidence]
    if cl.advice:
        lines.append("  advice:")
        lines += [f"  * {a}" for a in cl.advice]
    if d.tasks:
        lines.append("tasks:")
        width = max(map(len, d.tasks))
        for name, f in d.tasks.items():
            detail = f.evidence[0].split(": ", 1)[-1] if f.evidence else ""
            lines.append(f"  {name:<{width}}  {f.verdict:<19}  {detail}")
    return "\n".join(lines)


def to_json(d: verdict.Diagnosis) -> dict:
    return {
        "verdict": d.cluster.verdict,
        "code": d.cluster.code,
        "exit_code": d.exit_code,
        "cluster": asdict(d.cluster),
        "tasks": {k: asdict(v) for k, v in d.tasks.items()},
    }


def unreachable_json(message: str) -> dict:
    code = verdict.NO_DATA
    return {
        "verdict": verdict.NAMES[code],
        "code": code,
        "exit_code": verdict.EXIT_NO_DATA,
        "error": message,
        "cluster": None,
        "tasks": {},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m monitoring.diagnose", description=__doc__.splitlines()[0])
    p.add_argument("--prometheus", default=os.environ.get("PROMETHEUS_URL", DEFAULT_URL))
    p.add_argument("--project", default=c.DEFAULT_PROJECT, help="compose project or stack (make's PROJECT)")
    p.add_argument("--run", default="", help="run id (make's RUN); empty: the project's latest run")
    p.add_argument(
        "--bench",
        type=Path,
        default=Path(os.environ.get("RUN_DIR", ".run")) / "bench-comm.json",
        help="`make bench-comm` result, to compare the all-reduce bandwidth with the network's",
    )
    p.add_argument(
        "--tune",
        type=Path,
        default=Path(os.environ.get("RUN_DIR", ".run")) / "tune.json",
        help="`make tune`'s result, whose figures on this job the advice cites",
    )
    p.add_argument(
        "--compare",
        type=Path,
        default=Path(os.environ.get("RUN_DIR", ".run")) / "compare.json",
        help="`make compare`'s last verdict, quoted while its run is the one diagnosed",
    )
    p.add_argument(
        "--json", action="store_true", help="print JSON (verdict, code, exit_code, cluster, tasks)"
    )
    p.add_argument(
        "--terminal-exit-zero",
        action="store_true",
        help="a problem found exits 0 when stdout is a terminal and not --json (`make diagnose`: the verdict "
        "is on the screen, make's error line would read as a crash); scripts keep the codes",
    )
    args = p.parse_args(argv)
    prom = Prometheus(url=args.prometheus, timeout=5.0)
    try:
        run = runs.resolve(prom, args.project, args.run) or ""
        sel = rules.selector(args.project, run)
        results = {name: prom.query(expr) for name, expr in queries(sel).items()}
    except PrometheusError as err:
        message = f"diagnose: cannot query Prometheus at {args.prometheus}: {err}"
        print(message, file=sys.stderr)
        if args.json:  # a script parses stdout: no data is still an answer (a stack just started)
            print(json.dumps(unreachable_json(message), indent=2))
        return verdict.EXIT_NO_DATA
    gradient_bytes = max((_number(s["value"][1]) or 0 for s in results["allreduce_bytes"]), default=None)
    busbw, size = link_reference(args.bench, gradient_bytes)
    d = verdict.diagnose(samples(results), link_busbw=busbw, link_size=size)
    d = measured.with_measured(d, measured.load(args.tune), measured.load(args.compare), run, args.project)
    print(json.dumps(to_json(d), indent=2) if args.json else render(d))
    if (
        d.exit_code == verdict.EXIT_PROBLEM
        and args.terminal_exit_zero
        and not args.json
        and sys.stdout.isatty()
    ):
        print(
            f"(a problem: scripts get exit_code {verdict.EXIT_PROBLEM} from JSON=1; outside a terminal it fails)"
        )
        return verdict.EXIT_HEALTHY
    return d.exit_code


if __name__ == "__main__":
    sys.exit(main())
