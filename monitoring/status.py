"""`make status`: one row per task — container state, step, progress, steps/s, step time, where the
time goes, ETA — and the job's ETA where its number of steps is known (trainer_target_steps).

    python -m monitoring.status [--project NAME] [--run ID] [--prometheus URL] [--no-docker]

Container state comes from Docker (with --no-docker, e.g. for a swarm whose containers run on other
engines: the tasks and their last state as Prometheus saw them); everything else from Prometheus: raw trainer series through the
queries of monitoring/rules/recording.py (so it works without the recording rules and after the tasks have
exited, within the lookback window), of the project's run only: the one --run names (make passes the
last `make up`'s), else its latest (monitoring/runs.py). The generated promtool tests evaluate these
very queries.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Mapping

import contract as c
from compose import wait
from compose.engine import Engine, EngineError
from monitoring import runs
from monitoring.prom.client import DEFAULT_URL, Prometheus, PrometheusError
from monitoring.rules import recording as rules
from trainer.host import supervisor

Query = Callable[[str], dict[str, float]]
"""PromQL -> task name -> value."""
COLUMNS = (
    "task",
    "state",
    "step",
    "progress",
    "steps/s",
    "step time",
    "all-reduce",
    "input wait",
    "outside steps",
    "checkpoint",
    "ETA",
)


def queries(sel: str = rules.JOB_SELECTOR) -> dict[str, str]:
    """Column -> PromQL over the series `sel` selects (rules.selector: one project's run)."""

    def share(m: c.Metric) -> str:
        return f"{rules.rate(m.sum, sel=sel)} / {rules.rate(c.STEP.sum, sel=sel)}"

    step_time = f"{rules.rate(c.STEP.sum, sel=sel)} / {rules.rate(c.STEP.count, sel=sel)}"
    return {
        "step": rules.last_value(c.GLOBAL_STEP, sel=sel),
        # As the clock sees them: the last minute's while training, the whole run's once done.
        "steps/s": rules.steps_per_second_now(sel),
        "step time": step_time,
        "all-reduce": share(c.ALLREDUCE),
        "input wait": share(c.INPUT_WAIT),
        # Of the wall clock, not of the step: saves and host work between calls (rules.OUTSIDE_SHARE).
        "outside steps": f"1 - {rules.steps_per_second(sel=sel)} * ({step_time} >= 0)",
        "checkpoint": rules.last_value(c.LAST_CHECKPOINT, sel=sel),
        "target": rules.last_value(c.TARGET_STEPS, sel=sel),
    }


QUERIES = queries()
"""Over every run: what the promtool tests evaluate (their series carry no run)."""
FORMATS = {
    "step": "{:.0f}",
    "steps/s": "{:.1f}",
    "step time": "{:.3f} s",
    "all-reduce": "{:.0%}",
    "input wait": "{:.0%}",
    "outside steps": "{:.0%}",
    "checkpoint": "{:.0f}",
}


def containers(project: str) -> dict[str, str]:
    """service -> human state such as `running` or `exited (0), 2 restarts`."""
    engine = Engine()  # compose/engine.py: every docker call of the host tools
    out = engine.docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={project}").split()
    if not out:
        return {}
    fmt = (
        '{{index .Config.Labels "com.docker.compose.service"}}|{{.State.Status}}|'
        "{{.State.ExitCode}}|{{.RestartCount}}"
    )
    lines = engine.docker("inspect", "-f", fmt, *out).splitlines()
    states = {}
    for line in lines:
        service, status, code, restarts = line.split("|")
        text = f"{status} ({code})" if status == "exited" else status
        states[service] = text + (f", {restarts} restarts" if restarts != "0" else "")
    return states


def task_error_line(project: str, task: str) -> str:
    """The task's one-line error from its container's log, as `make wait` reads it."""
    container = Engine().tasks(project).get(task)
    return wait.error_line(container.id) if container else ""


def scraped_states(prom: Prometheus, sel: str = rules.JOB_SELECTOR) -> dict[str, str]:
    """task -> its last trainer state in Prometheus (for tasks whose containers Docker here cannot see)."""
    expr = f"last_over_time({c.STATE.name}{sel}[{rules.RUN_LOOKBACK}]) == 1"
    return {c.task_of(s["metric"]): s["metric"].get(c.STATE.client_name, "?") for s in prom.query(expr)}


def is_task(service: str) -> bool:
    """Trainer tasks are the services named as contract.task_name names them."""
    task_type, index = c.task_labels(service)
    return index.isdigit() and c.task_name(task_type, index) == service and task_type in (c.CHIEF, c.WORKER)


def duration(seconds: float) -> str:
    """`45s`, `3m05s`, `2h10m`: an ETA as people read it."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress(step: float, target: float, rate: float) -> tuple[float, float]:
    """(fraction done, seconds left at `rate` steps/s); NaN where the target or the rate is unknown
    (a target of 0 is the exporter's "unknown")."""
    if not (math.isfinite(target) and target > 0 and math.isfinite(step)):
        return math.nan, math.nan
    done = min(step / target, 1.0)
    left = max(target - step, 0.0)
    return done, (left / rate if math.isfinite(rate) and rate > 0 else (0.0 if not left else math.nan))


def _cell(col: str, x: float) -> str:
    # Absent and non-finite values (no step in the window) show as missing.
    if not math.isfinite(x):
        return "-"
    if col == "progress":
        return f"{x:.0%}"
    return duration(x) if col == "ETA" else FORMATS[col].format(x)


def table(states: Mapping[str, str], query: Query, sel: str = rules.JOB_SELECTOR) -> list[tuple[str, ...]]:
    values = {col: query(expr) for col, expr in queries(sel).items()}
    rows = [COLUMNS]
    for service in sorted(filter(is_task, states), key=c.task_order):
        got = {col: values[col].get(service, math.nan) for col in values}
        got["progress"], got["ETA"] = progress(got["step"], got["target"], got["steps/s"])
        rows.append((service, states[service], *(_cell(col, got[col]) for col in COLUMNS[2:])))
    return rows


UNKNOWN_TARGET = (
    "progress and ETA -: the run does not say how many steps it trains (a SCRIPT= custom loop; "
    "model.fit says it from epochs x steps_per_epoch)"
)
"""Why no progress is shown (trainer_target_steps 0: the exporter's unknown)."""


def job_line(rows: list[tuple[str, ...]], query: Query, sel: str = rules.JOB_SELECTOR) -> str | None:
    """The job's progress: synchronous tasks share a step, so the slowest estimate is the job's."""
    exprs = queries(sel)
    steps, targets, rates = (query(exprs[k]) for k in ("step", "target", "steps/s"))
    tasks = [r[0] for r in rows[1:]]
    known = [(steps[t], targets[t], rates.get(t, math.nan)) for t in tasks if t in steps and t in targets]
    if known and not any(n > 0 for _, n, _ in known):
        step = max(s for s, _, _ in known)
        # Before its first step a run has said nothing yet (the built-in loop says its STEPS then).
        return f"job: step {step:.0f}; {UNKNOWN_TARGET}" if step > 0 else "job: no step yet"
    known = [(s, n, r) for s, n, r in known if n > 0]
    if not known:
        return None
    step, target, rate = min(known, key=lambda k: k[0] / k[1])
    done, left = progress(step, target, rate)
    eta = f", ETA {duration(left)}" if math.isfinite(left) else ""
    at = f" at {rate:.1f} steps/s" if math.isfinite(rate) and left > 0 else ""
    return f"job: step {step:.0f} of {target:.0f} ({done:.0%}){eta}{at}"


KILLED = "exited (137)"
"""A container killed from outside (`docker kill`): Docker's restart policy counts it as a manual stop."""


def killed_notes(states: Mapping[str, str]) -> list[str]:
    """What restarts a task killed from outside while its peers wait (they wait for it for ever)."""
    if not any(s.startswith("running") for task, s in states.items() if is_task(task)):
        return []
    return [
        f"{task}: killed from outside ({KILLED}); its peers wait for it: `make wait` starts it again "
        "(and keeps the job going unattended), or `make up` restarts the job from its checkpoint"
        for task in sorted(filter(is_task, states), key=c.task_order)
        if states[task].startswith(KILLED)
    ]


EXITED = re.compile(r"exited \((\d+)\)")


def failed_notes(states: Mapping[str, str], error_line: Callable[[str], str]) -> list[str]:
    """A line per task that ended for good (its container exited 1-127), with its one-line error: the
    same line `make wait` reports (compose/wait.py error_line), e.g. a module the image lacks."""
    notes = []
    for task in sorted(filter(is_task, states), key=c.task_order):
        if (m := EXITED.match(states[task])) and 1 <= (code := int(m[1])) <= 127:
            why = error_line(task)
            notes.append(f"{task}: failed for good: exit code {code} ({supervisor.meaning(code)})"
                         + (f": {why}" if why else ""))  # fmt: skip
    return notes


def render(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monitoring.status", description=__doc__.splitlines()[0])
    parser.add_argument("--project", default=c.DEFAULT_PROJECT, help="compose project (make's PROJECT)")
    parser.add_argument("--run", default="", help="run id (make's RUN); empty: the project's latest run")
    parser.add_argument("--prometheus", default=DEFAULT_URL, help="Prometheus base URL")
    parser.add_argument(
        "--no-docker",
        action="store_true",
        help="take the tasks and their states from Prometheus, not from this Docker engine",
    )
    args = parser.parse_args(argv)
    prom = Prometheus(url=args.prometheus, timeout=5.0)

    def selector() -> str:  # Prometheus is asked only when needed: Docker's states show without it
        return rules.selector(args.project, runs.resolve(prom, args.project, args.run) or "")

    try:
        states = scraped_states(prom, selector()) if args.no_docker else containers(args.project)
    except PrometheusError as err:
        print(f"status: Prometheus at {args.prometheus} does not answer ({err})", file=sys.stderr)
        return 1
    except EngineError as err:
        print(f"status: {err}", file=sys.stderr)
        return 1
    if not states:
        where = f"Prometheus at {args.prometheus}" if args.no_docker else f"project {args.project}"
        print(
            f"status: no trainer tasks in {where}: run `make up PROJECT={args.project}` first",
            file=sys.stderr,
        )
        return 1
    try:
        rows = table(states, prom.by_task, selector())
    except PrometheusError as err:
        print(
            f"status: Prometheus at {args.prometheus} does not answer ({err}); showing container states only",
            file=sys.stderr,
        )
        rows = table(states, lambda _expr: {})
    print(render(rows))
    try:
        line = job_line(rows, prom.by_task, selector())
    except PrometheusError:
        line = None
    if line:
        print(line)
    for note in killed_notes(states):
        print(note)
    if not args.no_docker:
        for note in failed_notes(states, lambda task: task_error_line(args.project, task)):
            print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
