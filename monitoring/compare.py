"""`make compare`: did a change make the job faster? One run (RUN=, default the last `make up`'s)
against another (WITH=, default the project's run before it), per task and for the cluster: steps/s,
examples/s, the step and each part, each a median with its interquartile range over the run's steady
part (monitoring/verdicts/steady.py), the settings that differ, how often its rule calls a difference
between identical runs at these runs' window counts (monitoring/verdicts/chance.py), that the machine
drifts between runs, and one verdict line.

    python -m monitoring.compare [--prometheus URL] [--project P] [--run ID] [--with ID] [--skip S] [--json] [--out FILE]

Figures are of step time (the step histogram), so checkpoints' pauses between steps are left out, and
the first --skip seconds after a run's first step (tracing, warm-up). Runs of different tasks or world
sizes compare examples/s, and say so. Tasks' windows are paired by time. A run with fewer steady
windows than keep that chance rate at 5 % or below is refused, with how long a run must step. --out
keeps the verdict for `make diagnose` to quote (monitoring/verdicts/measured.py). Exit 0 compared, 2
bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import contract as c
from monitoring import runs
from monitoring.prom.client import DEFAULT_URL, Prometheus, PrometheusError
from monitoring.rules import recording as rules
from monitoring.verdicts import chance, steady

WINDOW_S = 15
"""Seconds per sample: three scrapes (every 5 s), so each window's increase has its own samples."""
MAX_POINTS = 1000
INPUT = "input wait"
PARTS = {"compute": c.COMPUTE, "all-reduce": c.ALLREDUCE, INPUT: c.INPUT_WAIT}
FIGURES = ("steps/s", "examples/s", "step ms", *(f"{p} ms" for p in PARTS), "other ms")
BY = ", ".join(c.LABELS)


class CompareError(ValueError):
    """Bad input: the one line `make compare` prints before exiting 2."""


@dataclass(frozen=True)
class Side:
    run: runs.Run
    figures: dict[str, dict[str, steady.Spread]]
    """Level (`cluster`, `chief`, `worker-0`, ...) -> figure -> spread over the steady windows."""
    windows: int


def _windowed(m: c.Metric, sel: str, window: int) -> str:
    return f"sum by ({BY}) (increase({m.sum}{sel}[{window}s])) / sum by ({BY}) (increase({m.count}{sel}[{window}s]))"


def window_samples(prom: Prometheus, run: runs.Run, project: str, skip: float, window: int = WINDOW_S):
    """Task -> figure -> steady per-window values, in seconds (step, parts) or examples per step."""
    sel = rules.selector(project, run.id)
    start = run.first_step + skip + window
    step = max(window, math.ceil((run.last_step - start) / MAX_POINTS))
    exprs = {
        "step": _windowed(c.STEP, sel, window),
        **{p: _windowed(m, sel, window) for p, m in PARTS.items()},
    }
    exprs["examples"] = (
        f"sum by ({BY}) (increase({c.EXAMPLES.name}{sel}[{window}s])) / sum by ({BY}) (increase({c.STEPS.name}{sel}[{window}s]))"
    )
    out: dict[str, dict[str, dict[float, float]]] = {}
    if run.last_step <= start:
        return out
    for name, expr in exprs.items():
        for s in prom.query_range(expr, start, run.last_step, step):
            values = {float(t): float(v) for t, v in s["values"] if math.isfinite(float(v))}
            out.setdefault(c.task_of(s["metric"]), {})[name] = values
    return out


Windows = dict[str, dict[float, float]]
"""Figure -> window's end (Unix time, the range query's own timestamps) -> value."""


def per_window(samples: dict[str, dict[float, float]]) -> Windows:
    """One task's windows (those with a step) -> FIGURES' values, each at its window's time."""
    figures: Windows = {f: {} for f in FIGURES}
    for t, step in sorted(samples.get("step", {}).items()):
        if step <= 0:
            continue
        parts = {p: samples.get(p, {}).get(t, 0.0) for p in PARTS}
        figures["steps/s"][t] = 1 / step
        figures["examples/s"][t] = samples.get("examples", {}).get(t, 0.0) / step
        figures["step ms"][t] = 1e3 * step
        for p, v in parts.items():
            figures[f"{p} ms"][t] = 1e3 * v
        figures["other ms"][t] = 1e3 * (step - sum(parts.values()))
    return figures


INPUT_SUM = "input wait, tasks' sum ms"
"""A window's input wait summed over the tasks: whichever task's input is late, its peers wait for it
in the all-reduce, so the task that waits changes from step to step and window to window (the
scheduler's noise picks it) while the sum stays the late input's. Per task, a 25 ms INPUT_DELAY_MS on
3 tasks under load moved inside each task's range, and the cluster's median task (a peer in the
all-reduce) read `all-reduce +15.1 ms` (CI, 2026-12-06)."""


def cluster_window(tasks: dict[str, Windows]) -> Windows:
    """The cluster's windows: the tasks' median of each figure (they step together), examples/s and
    INPUT_SUM summed, at each time every task has a window for. Paired by time: a window one task
    lacks (no step in it, a missed scrape) leaves out that window only; paired by position, each later
    window of that task met its peers' window before."""
    times = sorted(set.intersection(*(set(f["steps/s"]) for f in tasks.values()))) if tasks else []
    out: Windows = {f: {} for f in (*FIGURES, INPUT_SUM)}
    for t in times:
        for f in FIGURES:
            values = [task[f][t] for task in tasks.values()]
            out[f][t] = sum(values) if f == "examples/s" else statistics.median(values)
        out[INPUT_SUM][t] = sum(task[f"{INPUT} ms"][t] for task in tasks.values())
    return out


def summarize(tasks: dict[str, Windows]) -> dict[str, dict[str, steady.Spread]]:
    levels = {
        "cluster": cluster_window(tasks),
        **dict(sorted(tasks.items(), key=lambda kv: c.task_order(kv[0]))),
    }
    return {
        level: {f: steady.spread(list(v.values())) for f, v in figures.items() if v}
        for level, figures in levels.items()
        if figures["steps/s"]
    }


def side(prom: Prometheus, run: runs.Run, project: str, skip: float) -> Side:
    tasks = {t: per_window(s) for t, s in window_samples(prom, run, project, skip).items()}
    figures = summarize({t: f for t, f in tasks.items() if f["steps/s"]})
    if "cluster" not in figures:
        raise CompareError(
            f"run {run.id} has no steady part: it stepped for {run.last_step - run.first_step:.0f} s, "
            f"the first {skip:.0f} s are left out (COMPARE_SKIP=)"
        )
    return Side(run, figures, figures["cluster"]["steps/s"].n)


def enough(sides: tuple[Side, ...], skip: float) -> None:
    """Raises CompareError (one line: the rate at its count, how long to run) when a run has fewer steady
    windows than keep the rule's chance rate at chance.LIMIT or below (chance.minimum)."""
    least = chance.minimum()
    short = [s for s in sides if s.windows < least]
    if not short:
        return
    need = skip + least * WINDOW_S
    said = "; ".join(
        f"run {s.run.id} has {s.windows} (it stepped {s.run.last_step - s.run.first_step:.0f} s)"
        for s in short
    )
    odds = chance.of(*(s.windows for s in sides))
    raise CompareError(
        f"too few steady {WINDOW_S} s windows to compare: {said}; {least} a side keep "
        f"a difference called between identical runs at {chance.LIMIT:.0%} or below (with {odds.windows}: "
        f"{100 * odds.rate:.0f} %): a run must step at least {need:.0f} s ({skip:.0f} s left out, COMPARE_SKIP=, "
        f"then {least} windows), so let it run longer, or compare other runs (make runs)"
    )


def differing(a: dict[str, str], b: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Setting -> (old, new) for the settings the two runs recorded differently."""
    return {k: (a.get(k, ""), b.get(k, "")) for k in c.RUN_SETTING_LABELS if a.get(k, "") != b.get(k, "")}


def basis(old: Side, new: Side) -> str:
    """steps/s, or examples/s when a step is not the same work in both runs."""
    keys = ("task", "world_size", "per_replica_batch")
    same = (
        all(old.run.settings.get(k) == new.run.settings.get(k) for k in keys)
        and old.run.tasks == new.run.tasks
    )
    return "steps/s" if same else "examples/s"


DRIFT = (
    "; no recorded setting differs: what differs is the machine between the two runs (docs/tune.md) or the"
    " code or data; make tune compares settings turn by turn in one job"
)
"""A difference between runs of the same settings: not a setting's."""
BETWEEN = (
    "between runs: the machine drifts (its other work, caches, clock), which no window's spread covers: two runs"
    " of the same settings minutes apart have compared 1.27x beyond the spread (docs/tune.md); the chance rate"
    " is for windows drawn alike; make tune compares settings turn by turn in one job"
)
"""Printed with every comparison, whatever the settings: a window's spread is within a run."""


CAUSE_SHARE = 0.25
"""A task's input wait is the cause only if it moved by at least this share of the step's change: a
0.0 ms move beyond a near-zero spread was named the cause of a 6 % drift between two plain runs."""


def _input_moves(old: Side, new: Side, direction: int) -> list[float]:
    """The input wait's changes (ms per step) that moved beyond their spread the way the run did (grew
    in a slower run, shrank in a faster one) by a material share of the step's change: each task's,
    then (when no task's did) the tasks' sum (INPUT_SUM), the late input whichever task it was."""
    per_task = _moves(old, new, direction, f"{INPUT} ms", [t for t in new.figures if t != "cluster"])
    return per_task or _moves(old, new, direction, INPUT_SUM, ["cluster"])


def _moves(old: Side, new: Side, direction: int, key: str, levels: list[str]) -> list[float]:
    step = "step ms"
    floor = CAUSE_SHARE * abs(new.figures["cluster"][step].median - old.figures["cluster"][step].median)
    have = [lv for lv in levels if key in new.figures[lv] and key in old.figures.get(lv, {})]
    moved = [lv for lv in have if steady.compare(new.figures[lv][key], old.figures[lv][key]) == -direction]
    changes = (new.figures[lv][key].median - old.figures[lv][key].median for lv in moved)
    return [d for d in changes if abs(d) >= floor]


def _input_move(old: Side, new: Side, direction: int) -> float:
    return max(_input_moves(old, new, direction), key=abs)


def _cause(old: Side, new: Side, direction: int) -> str | None:
    """Input wait when any task's moved beyond its spread: in synchronous training a task waiting for
    its input holds every peer in the all-reduce, so the all-reduce's growth is its effect, and was
    named instead (a 33 ms INPUT_DELAY_MS read as all-reduce +21.9 ms under load)."""
    return INPUT if direction and _input_moves(old, new, direction) else None


def verdict(old: Side, new: Side) -> dict:
    """The one line, and its parts for JSON: direction (+1 faster, -1 slower, 0 none), ratio, the part
    that moved most."""
    figure = basis(old, new)
    a, b = old.figures["cluster"][figure], new.figures["cluster"][figure]
    direction, r = steady.compare(b, a), steady.ratio(b, a)
    moves = {
        p: new.figures["cluster"][f"{p} ms"].median - old.figures["cluster"][f"{p} ms"].median
        for p in (*PARTS, "other")
    }
    cause = _cause(old, new, direction)
    part = cause or max(moves, key=lambda p: abs(moves[p]))
    if cause:  # the task's own change, not the cluster's mean of it
        moves[part] = _input_move(old, new, direction)
    pct = abs(r.median - 1) * 100
    where = f"; {part} {moves[part]:+.1f} ms per step" if direction else ""
    per = (
        " (per example: the runs' steps differ in task, world size or batch)"
        if figure == "examples/s"
        else ""
    )
    same_settings = not differing(old.run.settings, new.run.settings)
    same = DRIFT if direction and same_settings else ""
    odds = chance.of(old.windows, new.windows)
    ranges = chance.visible(odds.windows, odds.windows)
    sees = 100 * ranges * (a.high - a.low) / a.median if a.median else math.nan
    if direction > 0:
        text = f"faster by {pct:.0f}% beyond the spread{per}"
    elif direction < 0:
        text = f"slower by {pct:.0f}% beyond the spread{per}"
    else:
        text = f"no difference beyond the spread ({figure} {r.median:.2f}x, ranges overlap){per}"
    return {
        "direction": direction,
        "figure": figure,
        "ratio": asdict(r),
        "part": part if direction else None,
        "part_change_ms": moves[part] if direction else None,
        "same_settings": same_settings,
        "chance": asdict(odds),
        "visible": {"ranges": ranges, "percent": sees, "power": chance.POWER},
        "between_runs": BETWEEN,
        "text": f"{new.run.id} vs {old.run.id}: {text}{where}{same} ({odds.text()})",
    }


def pick(known: list[runs.Run], run: str, other: str, project: str) -> tuple[runs.Run, runs.Run]:
    """(old, new): --with and --run, or the latest run and the one before it."""
    ids = ", ".join(r.id for r in known) or "none"
    new = runs.find(known, run) if run else (known[-1] if known else None)
    if new is None:
        raise CompareError(
            f"no run {run!r} of project {project} in Prometheus (runs: {ids}; make runs)"
            if run
            else f"project {project} has no run in Prometheus"
        )
    if other:
        old = runs.find(known, other)
        if old is None:
            raise CompareError(
                f"no run {other!r} of project {project} in Prometheus (runs: {ids}; make runs)"
            )
    else:
        before = [r for r in known if r.id < new.id]
        if not before:
            raise CompareError(
                f"project {project} has no run before {new.id} to compare with (runs: {ids}): "
                "make up again with a change, or WITH=<id>"
            )
        old = before[-1]
    if old.id == new.id:
        raise CompareError(f"RUN and WITH are the same run {new.id}: nothing to compare")
    return old, new


def _cell(s: steady.Spread | None) -> str:
    if s is None:
        return "-"
    digits = 1 if s.median >= 10 else 2
    return f"{s.median:.{digits}f} ({s.low:.{digits}f}-{s.high:.{digits}f})"


def render(old: Side, new: Side, skip: float, result: dict) -> str:
    lines = [
        f"compare: {new.run.id} (new, {new.windows} windows) against {old.run.id} (old, {old.windows} windows): "
        f"medians (interquartile range) of {WINDOW_S} s windows, the first {skip:.0f} s of each run left out, "
        "of step time (checkpoint pauses left out)",
    ]
    diff = differing(old.run.settings, new.run.settings)
    lines.append(
        "settings that differ: "
        + (", ".join(f"{k} {a or '-'} -> {b or '-'}" for k, (a, b) in diff.items()) or "none recorded")
    )
    header = f"{'':<10} {'figure':<16} {'old':>22} {'new':>22} {'new/old':>8}"
    lines.append(header)
    for level in [lv for lv in new.figures if lv in old.figures]:
        for f in FIGURES:
            a, b = old.figures[level].get(f), new.figures[level].get(f)
            r = f"{b.median / a.median:.2f}x" if a and b and a.median else "-"
            lines.append(f"{level:<10} {f:<16} {_cell(a):>22} {_cell(b):>22} {r:>8}")
    seen = result["visible"]
    lines.append(
        "chance: "
        + chance.Chance(**result["chance"]).text()
        + f"; a change it calls {seen['power'] * 10:.0f} times in 10: {seen['percent']:.1f} % in {result['figure']}"
        f" ({seen['ranges']:.2f} of the old run's interquartile ranges; more windows do not shrink it)"
    )
    lines.append(BETWEEN)
    lines.append("verdict: " + result["text"])
    return "\n".join(lines)


def to_json(old: Side, new: Side, skip: float, result: dict) -> dict:
    def figures(s: Side) -> dict:
        return {lv: {f: asdict(x) for f, x in fs.items()} for lv, fs in s.figures.items()}

    return {
        "old": {**asdict(old.run), "figures": figures(old)},
        "new": {**asdict(new.run), "figures": figures(new)},
        "skip_seconds": skip,
        "window_seconds": WINDOW_S,
        "settings_differ": {k: list(v) for k, v in differing(old.run.settings, new.run.settings).items()},
        "verdict": result,
    }


def record(path: Path, old: str, new: str, result: dict, project: str = "") -> None:
    """The verdict for `make diagnose`, which quotes it while `new` of `project` is the run it diagnoses."""
    path.parent.mkdir(parents=True, exist_ok=True)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    data = {"at": at, "project": project, "run": new, "with": old, "text": result["text"]}
    path.write_text(json.dumps(data, indent=2))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m monitoring.compare", description=__doc__.splitlines()[0])
    p.add_argument("--prometheus", default=os.environ.get("PROMETHEUS_URL", DEFAULT_URL))
    p.add_argument("--project", default=c.DEFAULT_PROJECT)
    p.add_argument("--run", default="", help="the new run (make's RUN; empty: the project's latest)")
    p.add_argument(
        "--with", dest="other", default="", help="the old run (make's WITH; empty: the run before)"
    )
    p.add_argument("--skip", type=float, default=steady.SKIP_S, help="seconds after the first step left out")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", type=Path, help="where the verdict goes for `make diagnose` to cite")
    args = p.parse_args(argv)
    prom = Prometheus(url=args.prometheus, timeout=20.0)
    try:
        old, new = pick(runs.describe(prom, args.project), args.run, args.other, args.project)
        a, b = side(prom, old, args.project, args.skip), side(prom, new, args.project, args.skip)
        enough((a, b), args.skip)
    except PrometheusError as err:
        print(f"compare: cannot query Prometheus at {args.prometheus}: {err}", file=sys.stderr)
        return 2
    except CompareError as err:
        print(f"compare: {err}", file=sys.stderr)
        return 2
    result = verdict(a, b)
    if args.out:
        record(args.out, old.id, new.id, result, args.project)
    print(
        json.dumps(to_json(a, b, args.skip, result), indent=2)
        if args.json
        else render(a, b, args.skip, result)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
