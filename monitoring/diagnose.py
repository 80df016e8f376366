"""`make diagnose`: the cluster's bottleneck from Prometheus, with evidence and advice.

    python -m monitoring.diagnose [--prometheus URL] [--bench .run/bench-comm.json] [--json]

Reads the task-level recording rules (1 minute windows) and the targets, states and build info of
the last few minutes, then judges with monitoring/verdict.py (the same logic as the dashboard's
rules in monitoring/prometheus/rules/verdict.yml). Exit 0 healthy (or finished), 1 a problem, 2 no data.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path

from monitoring import verdict
from monitoring.promql import Prometheus, PrometheusError

LOOKBACK = "5m"
"""How far back a target, state or build counts: a task that vanished minutes ago is still named."""
TRAINER = '{job="trainer"}'
QUERIES = {
    "up": f"last_over_time(up{TRAINER}[{LOOKBACK}])",
    "state": f"last_over_time(trainer_state{TRAINER}[1h]) == 1",
    "last_step_age": "task:trainer_last_step:age_seconds",
    "step": "task:trainer_step_duration_seconds:mean1m",
    "compute": "task:trainer_compute_duration_seconds:mean1m",
    "compute_share": "task:trainer_compute_duration_seconds:share1m",
    "allreduce_share": "task:trainer_allreduce_duration_seconds:share1m",
    "input_share": "task:trainer_input_wait_seconds:share1m",
    "compute_ratio": "task:trainer_compute_duration_seconds:ratio_to_median1m",
    "busbw": "task:trainer_allreduce_busbw_bytes_per_second:mean1m",
    "build": f"last_over_time(trainer_build_info{TRAINER}[{LOOKBACK}])",
    "world_size": f"last_over_time(trainer_world_size{TRAINER}[{LOOKBACK}])",
    "allreduce_bytes": "task:trainer_allreduce_bytes:per_step1m",
}
BUILD_LABELS = ("tf_version", "trainer_version", "strategy", "communication", "task")


def task_name(labels: dict) -> str:
    return f"{labels.get('task_type', '?')}-{labels.get('task_index', '?')}"


def _number(value: str) -> float | None:
    x = float(value)
    return x if math.isfinite(x) else None


def samples(results: dict[str, list[dict]]) -> list[verdict.TaskSample]:
    """TaskSamples from instant-query results (name in QUERIES -> Prometheus vector). Pure."""
    fields: dict[str, dict] = {}
    for s in results.get("up", []):
        fields.setdefault(task_name(s["metric"]), {})["up"] = float(s["value"][1]) == 1
    for name, vector in results.items():
        for s in vector:
            task = task_name(s["metric"])
            if task not in fields:
                continue  # a series of a task Prometheus no longer scrapes
            if name == "state":
                fields[task]["state"] = s["metric"].get("trainer_state")
            elif name == "build":
                fields[task]["build"] = tuple(s["metric"].get(k, "") for k in BUILD_LABELS)
            elif name == "world_size":
                fields[task]["world_size"] = int(float(s["value"][1]))
            elif name not in ("up", "allreduce_bytes"):
                fields[task]["last_step_age" if name == "last_step_age" else name] = _number(s["value"][1])
    order = lambda t: (not t.startswith("chief"), t)
    return [verdict.TaskSample(task=t, **fields[t]) for t in sorted(fields, key=order)]


def link_reference(path: Path, gradient_bytes: float | None) -> tuple[float | None, int | None]:
    """From `make bench-comm`'s result (if it has run): the best busbw (bytes/s) among its knob settings
    at the size nearest the training's bytes per all-reduce, and that size; else its overall best."""
    try:
        report = json.loads(path.read_text())
        if not gradient_bytes:
            return float(report["best"]["busbw"]), int(report["best"]["size"])
        sizes = {r["size"] for r in report["rows"]}
        size = min(sizes, key=lambda s: abs(math.log(s / gradient_bytes)))
        return max(r["busbw"] for r in report["rows"] if r["size"] == size), size
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


def render(d: verdict.Diagnosis) -> str:
    c = d.cluster
    lines = [f"cluster: {c.verdict.upper()}" + (f" ({', '.join(c.tasks)})" if c.tasks else "")]
    lines += [f"  - {e}" for e in c.evidence]
    if c.advice:
        lines.append("  advice:")
        lines += [f"  * {a}" for a in c.advice]
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m monitoring.diagnose", description=__doc__.splitlines()[0])
    p.add_argument("--prometheus", default=os.environ.get("PROMETHEUS_URL", "http://127.0.0.1:9090"))
    p.add_argument(
        "--bench",
        type=Path,
        default=Path(os.environ.get("RUN_DIR", ".run")) / "bench-comm.json",
        help="`make bench-comm` result, to compare the all-reduce bandwidth with the network's",
    )
    p.add_argument(
        "--json", action="store_true", help="print JSON (verdict, code, exit_code, cluster, tasks)"
    )
    args = p.parse_args(argv)
    prom = Prometheus(url=args.prometheus, timeout=5.0)
    try:
        results = {name: prom.query(expr) for name, expr in QUERIES.items()}
    except (PrometheusError, OSError) as err:  # requests' errors are OSErrors
        print(f"diagnose: cannot query Prometheus at {args.prometheus}: {err}", file=sys.stderr)
        return verdict.EXIT_NO_DATA
    gradient_bytes = max((_number(s["value"][1]) or 0 for s in results["allreduce_bytes"]), default=None)
    busbw, size = link_reference(args.bench, gradient_bytes)
    d = verdict.diagnose(samples(results), link_busbw=busbw, link_size=size)
    print(json.dumps(to_json(d), indent=2) if args.json else render(d))
    return d.exit_code


if __name__ == "__main__":
    sys.exit(main())
