"""`make status`: one row per task — container state, step, steps/s, step time, where the time goes.

Container state comes from Docker; everything else from Prometheus (raw trainer series, so it works
without recording rules and after the tasks have exited, within the lookback window).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping

from trainer.contract import DEFAULT_PROJECT

Query = Callable[[str], dict[tuple[str, str], float]]
WINDOW = "1m"
COLUMNS = ("task", "state", "step", "steps/s", "step time", "all-reduce", "input wait", "checkpoint")


def _rate(metric: str) -> str:
    return f"sum by (task_type, task_index) (rate({metric}[{WINDOW}]))"


QUERIES = {
    "step": "max by (task_type, task_index) (last_over_time(trainer_global_step[1h]))",
    "steps/s": _rate("trainer_steps_total"),
    "step time": f"{_rate('trainer_step_duration_seconds_sum')} / {_rate('trainer_step_duration_seconds_count')}",
    "all-reduce": f"{_rate('trainer_allreduce_duration_seconds_sum')} / {_rate('trainer_step_duration_seconds_sum')}",
    "input wait": f"{_rate('trainer_input_wait_seconds_sum')} / {_rate('trainer_step_duration_seconds_sum')}",
    "checkpoint": "max by (task_type, task_index) (last_over_time(trainer_last_checkpoint_step[1h]))",
}
FORMATS = {"step": "{:.0f}", "steps/s": "{:.2f}", "step time": "{:.3f} s", "all-reduce": "{:.0%}",
           "input wait": "{:.0%}", "checkpoint": "{:.0f}"}


def prometheus(url: str) -> Query:
    def query(expr: str) -> dict[tuple[str, str], float]:
        with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}",
                                    timeout=5) as resp:
            result = json.load(resp)["data"]["result"]
        return {(r["metric"].get("task_type", ""), r["metric"].get("task_index", "")): float(r["value"][1])
                for r in result}
    return query


def containers(project: str) -> dict[str, str]:
    """service -> human state such as `running` or `exited (0), 2 restarts`."""
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"],
                         capture_output=True, text=True, check=True).stdout.split()
    if not out:
        return {}
    fmt = ('{{index .Config.Labels "com.docker.compose.service"}}|{{.State.Status}}|'
           '{{.State.ExitCode}}|{{.RestartCount}}')
    lines = subprocess.run(["docker", "inspect", "-f", fmt, *out], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    states = {}
    for line in lines:
        service, status, code, restarts = line.split("|")
        text = f"{status} ({code})" if status == "exited" else status
        states[service] = text + (f", {restarts} restarts" if restarts != "0" else "")
    return states


def task_key(service: str) -> tuple[str, str] | None:
    if service == "chief":
        return ("chief", "0")
    if service.startswith("worker-") and service[7:].isdigit():
        return ("worker", service[7:])
    return None


def table(states: Mapping[str, str], query: Query) -> list[tuple[str, ...]]:
    values = {col: query(expr) for col, expr in QUERIES.items()}
    tasks = sorted((s for s in states if task_key(s)), key=lambda s: (s != "chief", len(s), s))
    rows = [COLUMNS]
    for service in tasks:
        key = task_key(service)
        # 0/0 rates (no step in the window) come back as NaN: show them as missing, like absent series.
        cells = [FORMATS[c].format(v) if (v := values[c].get(key, math.nan)) == v else "-" for c in QUERIES]
        rows.append((service, states[service], *cells))
    return rows


def render(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def main(argv: list[str]) -> int:
    url = argv[0] if argv else "http://127.0.0.1:9090"
    project = argv[1] if len(argv) > 1 else DEFAULT_PROJECT
    states = containers(project)
    if not states:
        print(f"status: no containers in project {project}: run `make up` first", file=sys.stderr)
        return 1
    try:
        rows = table(states, prometheus(url))
    except OSError as err:
        print(f"status: Prometheus at {url} does not answer ({err}); showing container states only",
              file=sys.stderr)
        rows = table(states, lambda _expr: {})
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
