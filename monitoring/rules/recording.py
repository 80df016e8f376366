"""The Prometheus side of the contract: recording-rule names and their PromQL, built from
contract/__init__.py (metric names) and monitoring/verdicts/verdict.py (thresholds, codes). Dashboards,
alerts, `make status`, `make diagnose` and `make report` take rule names and raw queries from here;
monitoring/rules/rulegen.py (`make rules`) writes the rule files.

Rule names are level:metric:operation; `task:` rules are by contract.TASK_BY (job, project, run,
instance, task_type, task_index), `cluster:` rules by contract.RUN_BY (job, project, run): runs never
mix, even when the same Prometheus still holds an earlier run's series. Ratios aggregate numerator and denominator separately, then divide
(averaging per-scrape ratios would weight idle and busy intervals alike).
"""

from __future__ import annotations

from pathlib import Path

import contract as c
from monitoring.verdicts import verdict as v

PROM_DIR = Path(__file__).resolve().parents[1] / "config" / "prometheus"
JOB_SELECTOR = f'{{job="{c.JOB}"}}'
BY_TASK = ", ".join(c.TASK_BY)
BY_RUN = ", ".join(c.RUN_BY)
WINDOW = "1m"
RUN_LOOKBACK = "1h"
"""How long after a task stops its whole-run figures stay queryable (`make status` after a run)."""


def task_rule(name: str, op: str) -> str:
    return f"task:{name}:{op}"


def cluster_rule(name: str, op: str) -> str:
    return f"cluster:{name}:{op}"


PARTS = (c.STEP, *c.STEP_PARTS)
SUM_RATE = {m: task_rule(m.sum, "rate1m") for m in PARTS}
COUNT_RATE = {m: task_rule(m.count, "rate1m") for m in PARTS}
MEAN = {m: task_rule(m.name, "mean1m") for m in PARTS}
"""Mean seconds per step of the whole step and of each part."""
OTHER = task_rule(f"{c.NAMESPACE}_step_other_seconds", "mean1m")
OUTSIDE = task_rule(f"{c.NAMESPACE}_step_outside_seconds", "mean1m")
"""Wall-clock seconds per step outside the timed steps (saves, host work between calls): what the
clock's rate (STEPS_PER_SECOND) leaves after the mean step."""
OUTSIDE_SHARE = task_rule(f"{c.NAMESPACE}_step_outside", "share1m")
"""Fraction of the wall clock outside the timed steps."""
SHARE = {m: task_rule(m.name, "share1m") for m in c.STEP_PARTS}
STEPS_PER_SECOND = task_rule(c.STEPS.client_name, "per_second1m")
STEPS_PER_SECOND_RUN = task_rule(c.STEPS.client_name, "per_second_run")
EXAMPLES_PER_STEP = task_rule(c.EXAMPLES.client_name, "per_step1m")
EXAMPLES_PER_SECOND = task_rule(c.EXAMPLES.client_name, "per_second1m")
BYTES_PER_STEP = task_rule(c.ALLREDUCE_BYTES.client_name, "per_step1m")
ALGBW = task_rule(f"{c.NAMESPACE}_allreduce_algbw_bytes_per_second", "mean1m")
BUSBW = task_rule(f"{c.NAMESPACE}_allreduce_busbw_bytes_per_second", "mean1m")
NET_RATE = {m: task_rule(m.client_name, "rate1m") for m in (c.NET_TRANSMIT, c.NET_RECEIVE)}
COMPUTE_RATIO = task_rule(c.COMPUTE.name, "ratio_to_others1m")
LAST_STEP_AGE = task_rule(f"{c.NAMESPACE}_last_step", "age_seconds")
VERDICT_CODE = task_rule(f"{c.NAMESPACE}_verdict", "code")
VERDICT_NAMED = task_rule(f"{c.NAMESPACE}_verdict", "named")

CLUSTER_EXAMPLES = cluster_rule(c.EXAMPLES.client_name, "per_second1m")
CLUSTER_STEPS = cluster_rule(c.STEPS.client_name, "per_second1m")
CLUSTER_STEPS_RUN = cluster_rule(c.STEPS.client_name, "per_second_run")
CLUSTER_SHARE = {m: cluster_rule(m.name, "share1m") for m in (c.ALLREDUCE, c.INPUT_WAIT)}
COMPUTE_REFERENCE = cluster_rule(c.COMPUTE.name, "reference1m")
STRAGGLER_RATIO = cluster_rule(c.COMPUTE.name, "straggler_ratio1m")
CLUSTER_ALGBW = cluster_rule(f"{c.NAMESPACE}_allreduce_algbw_bytes_per_second", "max1m")
CLUSTER_BUSBW = cluster_rule(f"{c.NAMESPACE}_allreduce_busbw_bytes_per_second", "max1m")
CLUSTER_NET_RATE = {m: cluster_rule(m.client_name, "rate1m") for m in (c.NET_TRANSMIT, c.NET_RECEIVE)}
TARGETS = cluster_rule(f"{c.NAMESPACE}_targets", "count")
TARGETS_UP = cluster_rule(f"{c.NAMESPACE}_targets_up", "sum")
BUILDS = cluster_rule(c.exposed_name(c.BUILD_INFO), "distinct")
CLUSTER_VERDICT_CODE = cluster_rule(f"{c.NAMESPACE}_verdict", "code")
CLUSTER_VERDICT_NAMED = cluster_rule(f"{c.NAMESPACE}_verdict", "named")

UP = f"up{JOB_SELECTOR}"
BUILD_INFO = c.exposed_name(c.BUILD_INFO)
BUILD_BY = ", ".join(c.BUILD_LABELS)


# --- Raw queries: what the rules record, written so they also run without the rules ---


def selector(project: str | None = None, run: str | None = None) -> str:
    """`{job="trainer", project="P", run="R"}`: the series of one stack's run (None: any). Recording
    rules keep both labels, so `rule + selector(...)` selects their values the same way."""
    pairs = {"job": c.JOB, c.PROJECT_LABEL: project, c.RUN_LABEL: run}
    return "{" + ", ".join(f'{k}="{v}"' for k, v in pairs.items() if v is not None) + "}"


def rate(series: str, window: str = WINDOW, sel: str = JOB_SELECTOR) -> str:
    """Per-task rate of a counter (or histogram _sum/_count) series."""
    return f"sum by ({BY_TASK}) (rate({series}{sel}[{window}]))"


def _paired(m: c.Metric, sel: str) -> str:
    """`m` at the scrapes that saw a step (last-step timestamp > 0): its value and the timestamp then
    come from the same scrape, so a difference of each spans the same steps."""
    return f"({m.name}{sel} and on ({BY_TASK}) ({c.LAST_STEP_TIME.name}{sel} > 0))"


def _first(m: c.Metric, span: str, sel: str) -> str:
    return f"min by ({BY_TASK}) (min_over_time({_paired(m, sel)}[{span}:]))"


def steps_per_second(window: str = WINDOW, sel: str = JOB_SELECTOR) -> str:
    """Steps per second as the clock sees them, of a live task not done: the steps since the first
    step the window saw over the seconds since it, so the time between steps (saves, host work
    between calls) and a stall's standstill (0) are in it, and a run's start-up before its first step
    is not. 1 / the mean step time left the time between steps out and ran ahead of the clock (issue
    29: 66.9 steps/s shown, 46.1 by the chief's own log). Only while the task's series are live: once
    the process has exited its window still holds its last steps, and their count over the window
    read as a crawl (7.5 steps/s after a 37.8 steps/s run); a done or gone task gets the run's rate."""
    steps = f"sum by ({BY_TASK}) ({c.STEPS.name}{sel})"
    since = f"(time() - {_first(c.LAST_STEP_TIME, window, sel)})"
    over = f'{c.STATE.name}{sel[:-1]}, {c.STATE.client_name}=~"done|failed"}} == 1'
    # A restart in the window (the counter reset) pairs another process's first step with this one's
    # count (-39.8 steps/s seen): then the steps over the whole window, the restart's pause included.
    restarted = f"sum by ({BY_TASK}) (resets({c.STEPS.name}{sel}[{window}])) > 0"
    steady = f"({steps} - {_first(c.STEPS, window, sel)}) / ({since} > 0) unless on ({BY_TASK}) ({restarted})"
    across = f"{rate(c.STEPS.name, window, sel)} and on ({BY_TASK}) ({restarted})"
    return f"((({steady}) or ({across})) unless on ({BY_TASK}) ({over}))"


def steps_per_second_run(lookback: str = RUN_LOOKBACK, sel: str = JOB_SELECTOR) -> str:
    """Steps per second as the clock saw them over the run, also after it finished: the global step's
    progress from the first scrape that saw a step to the last, over the last-step timestamps of the
    same scrapes (restarts, resumes and lost steps included). Absent for a run seen by one scrape."""

    def last(m: c.Metric) -> str:
        return f"max by ({BY_TASK}) (last_over_time({m.name}{sel}[{lookback}]))"

    steps = f"({last(c.GLOBAL_STEP)} - {_first(c.GLOBAL_STEP, lookback, sel)})"
    return f"{steps} / (({last(c.LAST_STEP_TIME)} - {_first(c.LAST_STEP_TIME, lookback, sel)}) > 0)"


def steps_per_second_now(sel: str = JOB_SELECTOR) -> str:
    """`make status`'s steps/s: the last minute's clock rate of a task not done, the run's of one done
    or gone (its series older than the window)."""
    return f"{steps_per_second(sel=sel)} or {steps_per_second_run(sel=sel)}"


def last_value(m: c.Metric, lookback: str = RUN_LOOKBACK, sel: str = JOB_SELECTOR) -> str:
    """A task's last value of a gauge in the lookback: figures of tasks that have exited."""
    return f"max by ({BY_TASK}) (last_over_time({m.name}{sel}[{lookback}]))"


def loss_after_first_step(selector: str = JOB_SELECTOR) -> str:
    """The loss gauge reads 0 until a process's first step: only after that."""
    return f"{c.LOSS.name}{selector} and on ({BY_RUN}, instance) ({c.STEPS.name}{selector} > 0)"


def by_job(op: str, expr: str) -> str:
    return f"{op} by ({BY_RUN}) ({expr})"


# --- Recording rules ---


def _per_task_rules() -> list[tuple[str, str]]:
    rules = []
    for m in PARTS:
        rules += [(SUM_RATE[m], rate(m.sum)), (COUNT_RATE[m], rate(m.count))]
    rules += [(MEAN[m], f"{SUM_RATE[m]} / {COUNT_RATE[m]}") for m in PARTS]
    # Not clamped at 0: a negative value means the parts were measured wrongly, and must stay visible.
    rules.append((OTHER, " - ".join(MEAN[m] for m in PARTS)))
    rules += [(SHARE[m], f"{SUM_RATE[m]} / {SUM_RATE[c.STEP]}") for m in c.STEP_PARTS]
    rules += [
        # After the run (done, or gone) the whole run's: examples/s and the time outside steps stay readable.
        (STEPS_PER_SECOND, steps_per_second_now()),
        (STEPS_PER_SECOND_RUN, steps_per_second_run()),
        # The clock's seconds per step minus the mean step: what 'other' (inside the step) does not hold.
        (OUTSIDE, f"1 / ({STEPS_PER_SECOND} > 0) - ({MEAN[c.STEP]} >= 0)"),
        (OUTSIDE_SHARE, f"1 - {STEPS_PER_SECOND} * ({MEAN[c.STEP]} >= 0)"),
        # Per step from the counters, not the histogram's count: right when only one step in K is timed.
        (EXAMPLES_PER_STEP, f"{rate(c.EXAMPLES.name)} / ({rate(c.STEPS.name)} > 0)"),
        (EXAMPLES_PER_SECOND, f"{EXAMPLES_PER_STEP} * {STEPS_PER_SECOND}"),
        (BYTES_PER_STEP, f"{rate(c.ALLREDUCE_BYTES.name)} / ({rate(c.STEPS.name)} > 0)"),
    ]
    rules += [(NET_RATE[m], rate(m.name)) for m in NET_RATE]
    world = f"max by ({BY_TASK}) ({c.WORLD_SIZE.name})"
    rules += [
        # nccl-tests definitions: algbw = bytes / time; busbw = algbw * 2(n-1)/n, comparable across
        # cluster sizes and with the link's bandwidth (n = 1 gives 0: nothing crosses a link).
        (ALGBW, f"{BYTES_PER_STEP} / {MEAN[c.ALLREDUCE]}"),
        (BUSBW, f"{ALGBW} * on ({BY_TASK}) (2 * ({world} - 1) / {world})"),
        (LAST_STEP_AGE, f"time() - max by ({BY_TASK}) ({c.LAST_STEP_TIME.name} > 0)"),
    ]
    return rules


def _straggler_rules() -> list[tuple[str, str]]:
    """verdict.compute_reference in PromQL: the median of the tasks once the slowest is set aside,
    i.e. the quantile (n-2)/(2(n-1)) of all n (one task: itself). In synchronous training a
    straggler's step time looks like everyone's (the others wait for it inside all-reduce), so
    compute time names it. quantile takes one scalar: this assumes one live run per Prometheus (each stack has its own; an earlier run has gone stale)."""
    timed = f"({MEAN[c.COMPUTE]}{JOB_SELECTOR} >= 0)"  # drops NaN: tasks with no step in the window
    n = f"count({timed})"
    others_median = f"quantile by ({BY_RUN}) (scalar(({n} - 2) / (2 * ({n} - 1))), {timed})"
    return [
        (COMPUTE_REFERENCE, f"({others_median} > 0) or {by_job('max', timed)}"),
        (COMPUTE_RATIO, f"{timed} / on ({BY_RUN}) group_left {COMPUTE_REFERENCE}"),
        (STRAGGLER_RATIO, f"{by_job('max', timed)} / {COMPUTE_REFERENCE}"),
    ]


def _cluster_rules() -> list[tuple[str, str]]:
    def share(m: c.Metric) -> str:
        return f"{by_job('sum', SUM_RATE[m])} / {by_job('sum', SUM_RATE[c.STEP])}"

    return [
        (CLUSTER_EXAMPLES, by_job("sum", EXAMPLES_PER_SECOND)),
        # Synchronous: the cluster steps at its slowest task's pace.
        (CLUSTER_STEPS, by_job("min", STEPS_PER_SECOND)),
        (CLUSTER_STEPS_RUN, by_job("min", STEPS_PER_SECOND_RUN)),
        *[(CLUSTER_SHARE[m], share(m)) for m in CLUSTER_SHARE],
        # The task that waits least inside all-reduce (the slowest) measures closest to the transfer.
        (CLUSTER_ALGBW, by_job("max", ALGBW)),
        (CLUSTER_BUSBW, by_job("max", BUSBW)),
        *[(CLUSTER_NET_RATE[m], by_job("sum", NET_RATE[m])) for m in CLUSTER_NET_RATE],
        (TARGETS, by_job("count", UP)),
        (TARGETS_UP, by_job("sum", UP)),
        (BUILDS, f"count by ({BY_RUN}) (count by ({BY_RUN}, {BUILD_BY}) ({BUILD_INFO}))"),
    ]


def recording_rules() -> dict:
    rules = _per_task_rules() + _straggler_rules() + _cluster_rules()
    # One group: a group evaluates in order, so later rules see this evaluation's results.
    return {"groups": [{"name": "trainer_recording", "rules": [{"record": r, "expr": e} for r, e in rules]}]}


# --- The verdict in PromQL (monitoring/verdicts/verdict.py) ---


def _task_code(condition: str, code: int) -> str:
    return f"(0 * max by ({BY_TASK}) ({condition}) + {code})"


def down_condition() -> str:
    """Not answering, and not because it finished (its last scraped state was done)."""
    done = f'last_over_time({c.STATE.name}{{{c.STATE.client_name}="done"}}[{RUN_LOOKBACK}]) == 1'
    return f"{UP} == 0 unless on ({BY_RUN}, instance) ({done})"


def stall_condition(age: str) -> str:
    busy = f'{c.STATE.name}{{{c.STATE.client_name}=~"done|checkpointing"}} == 1'
    return f"{age} > {v.STALL_SECONDS:g} unless on ({BY_TASK}) ({busy})"


def stuck_condition() -> str:
    """Ended as stuck by its supervisor at most verdict.STUCK_RECENT seconds ago (the next run says so)."""
    return f"time() - {c.STUCK_TIME.name} <= {v.STUCK_RECENT:g}"


def _mismatch_condition() -> str:
    per_task = f"count by ({BY_TASK}, {BUILD_BY}) ({BUILD_INFO})"
    per_build = f"count by ({BY_RUN}, {BUILD_BY}) ({BUILD_INFO})"
    return (
        f"({per_task} * on ({BY_RUN}, {BUILD_BY}) group_left {per_build})"
        f" < on ({BY_RUN}) group_left max by ({BY_RUN}) ({per_build})"
        f" or {c.WORLD_SIZE.name} < on ({BY_RUN}) group_left max by ({BY_RUN}) ({c.WORLD_SIZE.name})"
    )


def _named(code_rule: str) -> str:
    return " or ".join(
        f'label_replace({code_rule} == {code}, "verdict", "{v.NAMES[code]}", "", "")'
        for code in reversed(range(len(v.SEVERITY)))  # most severe first
    )


def verdict_rules() -> dict:
    # Each branch of an `or` chain carries the same labels, so `or` keeps the first (highest) code.
    task = " or ".join(
        [
            _task_code(down_condition(), v.DOWN),
            _task_code(stuck_condition(), v.STUCK),
            _task_code(stall_condition(LAST_STEP_AGE), v.STALLED),
            _task_code(_mismatch_condition(), v.MISMATCH),
            _task_code(f"{COMPUTE_RATIO} > {v.STRAGGLER_RATIO:g}", v.STRAGGLER),
            _task_code(f"{SHARE[c.INPUT_WAIT]} > {v.INPUT_SHARE:g}", v.INPUT),
            _task_code(f"{SHARE[c.ALLREDUCE]} > {v.ALLREDUCE_SHARE:g}", v.COMMUNICATION),
            # Healthy needs the split: timed steps alone (a SCRIPT= XLA step, not sampled) say nothing.
            _task_code(f"{SHARE[c.COMPUTE]} >= 0", v.HEALTHY),
        ]
    )
    worst = by_job("max", VERDICT_CODE)
    worlds = f'count by ({BY_RUN}) (count_values by ({BY_RUN}) ("world_size", {c.WORLD_SIZE.name}))'
    # The worst task, except that communication-bound needs every task (if only some wait in
    # all-reduce, nobody is clearly to blame), and a mismatch is also two equal halves.
    cluster = " or ".join(
        [
            f"({worst} >= {v.MISMATCH})",
            f"(0 * ({BUILDS} > 1) + {v.MISMATCH})",
            f"(0 * ({worlds} > 1) + {v.MISMATCH})",
            f"({worst} >= {v.INPUT})",
            f"(0 * ({by_job('min', SHARE[c.ALLREDUCE])} > {v.ALLREDUCE_SHARE:g}) + {v.COMMUNICATION})",
            f"(0 * {worst})",
        ]
    )
    rules = [
        (VERDICT_CODE, task),
        (CLUSTER_VERDICT_CODE, cluster),
        (VERDICT_NAMED, _named(VERDICT_CODE)),
        (CLUSTER_VERDICT_NAMED, _named(CLUSTER_VERDICT_CODE)),
    ]
    return {"groups": [{"name": "trainer_verdict", "rules": [{"record": r, "expr": e} for r, e in rules]}]}
