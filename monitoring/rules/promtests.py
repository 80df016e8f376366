"""promtool unit tests, written by `make rules` (monitoring/rules/rulegen.py).

verdict_tests: every case of monitoring/verdicts/cases.py as series scraped every 5 s for 4 minutes,
with the task and cluster verdict codes the case table expects and the alerts (labels and rendered
prose) that its figures must fire; and two stacks in one Prometheus, each judged on its own series. rate_tests: steps per second of a short finished run and a long
one, through the recording rules and through the very queries `make status` sends.
"""

from __future__ import annotations

import math

import contract as c
from monitoring.rules import alerts
from monitoring.rules import recording as r
from monitoring.verdicts import verdict as v
from monitoring.verdicts.cases import BUILD, CASES, COMM, THREE, Case, Task, cluster, sample

INTERVAL = 5
END = 240
"""Seconds: the cases are evaluated at 4m, when every `for:` of the alerts has elapsed."""
POINTS = END // INTERVAL
PROJECT, RUN = c.DEFAULT_PROJECT, "20261201T090000Z"
"""The target labels (contract.TARGET_LABELS) of the cases' series, as the emitters write them."""


def run_labels(project: str = PROJECT, run: str = RUN) -> dict[str, str]:
    return {"job": c.JOB, c.PROJECT_LABEL: project, c.RUN_LABEL: run}


def _braces(pairs: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{val}"' for k, val in pairs.items()) + "}"


def labels(task: str, /, project: str = PROJECT, run: str = RUN, **extra: str) -> str:
    return _braces({**_label_dict(task, project, run), **extra})


def _num(x: float) -> str:
    return format(round(x, 9), ".12g")


def _grow(per_interval: float) -> str:
    return f"0+{_num(per_interval)}x{POINTS}"


def _flat(value: float) -> str:
    return f"{_num(value)}x{POINTS}"


def _timed(t: Task) -> dict[str, str]:
    """Histograms and counters: steps per interval times mean seconds of each part."""
    steps = INTERVAL / t.step if t.stepping else 0.0
    seconds = {c.STEP: t.step, c.COMPUTE: t.compute, c.ALLREDUCE: t.allreduce, c.INPUT_WAIT: t.input}
    if not t.split:
        seconds = {c.STEP: t.step}
    out = {c.STEPS.name: _grow(steps)}
    for m, mean in seconds.items():
        out |= {m.count: _grow(steps), m.sum: _grow(steps * mean)}
    return out


def _repeat(x: float) -> str:
    """A non-finite value at every point (promtool's `NxM` expansion takes finite numbers only)."""
    return " ".join(["Inf" if x > 0 else "-Inf" if x < 0 else "NaN"] * (POINTS + 1))


def _last_step(t: Task) -> str:
    if t.last_step_age is None:
        return _flat(0)
    if t.stepping:
        return f"{_num(-t.last_step_age)}+{INTERVAL}x{POINTS}"
    return _flat(END - t.last_step_age)


def task_series(t: Task, project: str = PROJECT, run: str = RUN) -> list[dict]:
    """What Prometheus scrapes from this task; a task that is down left only its earlier state."""

    def labels_(**extra: str) -> str:
        return labels(t.name, project, run, **extra)

    up = [{"series": f"up{labels_()}", "values": _flat(1 if t.up else 0)}]
    state = f"{c.STATE.name}{labels_(**{c.STATE.client_name: t.state})}"
    if not t.up:
        return up + [{"series": state, "values": f"1x{POINTS // 4} stale"}]
    build = dict(zip(c.BUILD_LABELS, t.build, strict=True))
    series = {
        state: _flat(1),
        f"{c.LAST_STEP_TIME.name}{labels_()}": _last_step(t),
        f"{c.WORLD_SIZE.name}{labels_()}": _flat(t.world_size),
        f"{c.LOSS.name}{labels_()}": _flat(t.loss) if math.isfinite(t.loss) else _repeat(t.loss),
        f"{r.BUILD_INFO}{labels_(**build)}": _flat(1),
    }
    series |= {f"{name}{labels_()}": values for name, values in _timed(t).items()}
    if t.stuck_step is not None:  # the run after the restart exports where its task was stuck
        series |= {
            f"{c.STUCK_STEP.name}{labels_()}": _flat(t.stuck_step),
            f"{c.STUCK_TIME.name}{labels_()}": _flat(END - t.stuck_age),
        }
    return up + [{"series": k, "values": val} for k, val in series.items()]


CODE = {name: k for k, name in v.NAMES.items()}


def _task_codes(case: Case, project: str = PROJECT, run: str = RUN) -> list[dict]:
    return [
        {"labels": f"{r.VERDICT_CODE}{labels(t, project, run)}", "value": CODE[name]}
        for t, name in case.per_task.items()
    ]


def _cluster_codes(case: Case, project: str = PROJECT, run: str = RUN) -> list[dict]:
    code = CODE[case.verdict]
    where = _braces(run_labels(project, run))
    return [{"labels": f"{r.CLUSTER_VERDICT_CODE}{where}", "value": code}] if code >= 0 else []


def _codes(case: Case) -> list[dict]:
    at = f"{END}s"
    return [
        {"expr": r.VERDICT_CODE, "eval_time": at, "exp_samples": _task_codes(case)},
        {"expr": r.CLUSTER_VERDICT_CODE, "eval_time": at, "exp_samples": _cluster_codes(case)},
    ]


def firing(case: Case) -> dict[str, dict[str, float]]:
    """Alert -> task -> value, by the thresholds of monitoring/verdicts/verdict.py."""
    samples = {t.name: sample(t) for t in case.tasks}
    timed = {t.name: samples[t.name] for t in case.tasks if t.stepping}
    ratios = v.compute_ratios(list(timed.values()))
    return {
        "TrainerDown": {t.name: 0.0 for t in case.tasks if not t.up and t.state != "done"},
        "TaskStuck": {t.name: t.stuck_step for t in case.tasks if t.up and v.stuck(samples[t.name])},
        "TrainingStalled": {
            t.name: t.last_step_age for t in case.tasks if t.up and v.stalled(samples[t.name])
        },
        "Straggler": {n: x for n, x in ratios.items() if x > v.STRAGGLER_RATIO},
        "InputBound": {n: s.input_share for n, s in timed.items() if (s.input_share or 0) > v.INPUT_SHARE},
        "CommunicationBound": {
            n: s.allreduce_share for n, s in timed.items() if (s.allreduce_share or 0) > v.ALLREDUCE_SHARE
        },
        "LossNotFinite": {t.name: t.loss for t in case.tasks if t.up and not math.isfinite(t.loss)},
    }


def _alert_tests(case: Case) -> list[dict]:
    tests = []
    for name, tasks in firing(case).items():
        alert = alerts.BY_NAME[name]
        expected = [
            {
                "exp_labels": {"severity": alert.severity, **_label_dict(task)},
                "exp_annotations": alert.render(task, value),
            }
            for task, value in tasks.items()
        ]
        tests.append({"eval_time": f"{END}s", "alertname": name, "exp_alerts": expected})
    return tests


def _label_dict(task: str, project: str = PROJECT, run: str = RUN) -> dict[str, str]:
    task_type, index = c.task_labels(task)
    return {
        **run_labels(project, run),
        "instance": f"{task}:{c.METRICS_PORT}",
        c.TASK_TYPE: task_type,
        c.TASK_INDEX: index,
    }


SCRIPT_BUILD = (*BUILD[:2], "script", "script", "train.py")
TWO_STACKS = (
    (
        "alerts-a",
        "20261201T080000Z",
        Case(name="a", tasks=cluster(), verdict="healthy", per_task=dict.fromkeys(THREE, "healthy")),
    ),
    (
        "alerts-b",
        "20261201T081000Z",
        Case(
            name="b",
            tasks=cluster(**dict.fromkeys(THREE, {**COMM, "build": SCRIPT_BUILD})),
            verdict="communication-bound",
            per_task=dict.fromkeys(THREE, "communication-bound"),
        ),
    ),
)
"""Two stacks whose tasks have the same names but different builds, scraped by one Prometheus: each
has its own verdict (judged over every series together they would be a mismatch)."""


def two_stacks_test() -> dict:
    at = f"{END}s"
    return {
        "name": "two stacks in one Prometheus",
        "interval": f"{INTERVAL}s",
        "input_series": [
            s for p, run, case in TWO_STACKS for t in case.tasks for s in task_series(t, p, run)
        ],
        "promql_expr_test": [
            {
                "expr": r.VERDICT_CODE,
                "eval_time": at,
                "exp_samples": [s for p, run, case in TWO_STACKS for s in _task_codes(case, p, run)],
            },
            {
                "expr": r.CLUSTER_VERDICT_CODE,
                "eval_time": at,
                "exp_samples": [s for p, run, case in TWO_STACKS for s in _cluster_codes(case, p, run)],
            },
        ],
    }


def verdict_tests() -> dict:
    groups = [
        {
            "name": case.name,
            "interval": f"{INTERVAL}s",
            "input_series": [s for t in case.tasks for s in task_series(t)],
            "promql_expr_test": _codes(case),
            "alert_rule_test": _alert_tests(case),
        }
        for case in CASES
    ]
    groups.append(two_stacks_test())
    return {
        "rule_files": ["../rules/trainer.rules.yml", "../rules/verdict.yml", "../rules/trainer.alerts.yml"],
        "evaluation_interval": f"{INTERVAL}s",
        "tests": groups,
    }


# --- Steps per second ---

SHORT = {"steps": 100, "seconds": 1.25}
"""100 steps in 1.25 s of step time (80 steps/s), finished before Prometheus' second scrape: no
clock rate can be known from one scrape (done, it has no last-minute rate; `make status` shows `-`)."""
LONG = {
    "steps_per_interval": 50,
    "step": 0.08,
    "allreduce": 0.05,
    "bytes_per_step": 3000,
    "examples_per_step": 16,
    "world": 4,
}
"""10 steps/s for minutes (12.5 per second of step time: the clock's rate is the 10); 0.05 s and 3000 bytes per all-reduce, world size 4: algbw 60000 B/s,
busbw 60000 * 2*3/4 = 90000 B/s; 16 examples per step: 160 examples/s."""


def short_run_series(task: str = c.CHIEF) -> list[dict]:
    """A run over between two scrapes: 0 at t=0, all its steps at t=5s, then unchanged."""
    n, seconds = SHORT["steps"], SHORT["seconds"]
    values = {
        c.STEP.count: n,
        c.STEP.sum: seconds,
        c.STEPS.name: n,
        c.GLOBAL_STEP.name: n,
        c.LAST_STEP_TIME.name: 1000 + seconds,
    }
    done = labels(task, **{c.STATE.client_name: "done"})
    return [
        {"series": f"{name}{labels(task)}", "values": f"0 {_num(x)}x{POINTS - 1}"}
        for name, x in values.items()
    ] + [{"series": f"{c.STATE.name}{done}", "values": f"0 1x{POINTS - 1}"}]


def long_run_series(task: str = "worker-0") -> list[dict]:
    """A step ends every 0.1 s, each 0.08 s long: 0.02 s of every 0.1 s is outside the steps."""
    n = LONG["steps_per_interval"]
    values = {
        c.STEP.count: _grow(n),
        c.STEP.sum: _grow(n * LONG["step"]),
        c.STEPS.name: _grow(n),
        c.GLOBAL_STEP.name: _grow(n),
        c.ALLREDUCE.count: _grow(n),
        c.ALLREDUCE.sum: _grow(n * LONG["allreduce"]),
        c.ALLREDUCE_BYTES.name: _grow(n * LONG["bytes_per_step"]),
        c.EXAMPLES.name: _grow(n * LONG["examples_per_step"]),
        c.WORLD_SIZE.name: _flat(LONG["world"]),
        c.LAST_STEP_TIME.name: f"0+{INTERVAL}x{POINTS}",
    }
    return [{"series": f"{name}{labels(task)}", "values": val} for name, val in values.items()]


GONE = {"task": "worker-1", "until": 60}
"""A task that stepped at the long run's pace until 60 s, then exited (its series stale)."""


def gone_run_series() -> list[dict]:
    """The long run's steps until GONE's end, then stale: the process is gone, its window still holds
    its last minute (issue 29: a finished task read 7.5 steps/s against its log's 37.8)."""
    n, points = LONG["steps_per_interval"], GONE["until"] // INTERVAL
    values = {
        c.STEPS.name: f"0+{_num(n)}x{points}",
        c.GLOBAL_STEP.name: f"0+{_num(n)}x{points}",
        c.LAST_STEP_TIME.name: f"0+{INTERVAL}x{points}",
    }
    return [{"series": f"{name}{labels(GONE['task'])}", "values": f"{v} stale"} for name, v in values.items()]


RESTARTED = {"task": "worker-2", "at": 150}
"""A task at the long run's pace whose process restarted at 150 s (its counter reset, no step for 10 s)."""


def restarted_run_series() -> list[dict]:
    n, points = LONG["steps_per_interval"], RESTARTED["at"] // INTERVAL
    after = POINTS - points - 2  # the samples after the restart's two idle scrapes (0 until a step)
    start = RESTARTED["at"] + 3 * INTERVAL  # the first sample after the two idle ones
    values = {
        c.STEPS.name: f"0+{_num(n)}x{points} 0 0 {_num(n)}+{_num(n)}x{after}",
        c.LAST_STEP_TIME.name: f"0+{INTERVAL}x{points} 0 0 {start}+{INTERVAL}x{after}",
    }
    return [{"series": f"{name}{labels(RESTARTED['task'])}", "values": v} for name, v in values.items()]


def between(expr: str, low: float, high: float) -> str:
    """1 where expr is in (low, high]: promtool compares exactly, a rate across a restart is the window's."""
    return f"(({expr}) > bool {_num(low)}) * (({expr}) <= bool {_num(high)})"


def rounded(expr: str) -> str:
    """promtool compares exactly; rates of exact series still carry float rounding."""
    return f"round({expr}, {PRECISION})"


PRECISION = 0.001


def expect(expr: str, at: str, values: dict[str, float]) -> dict:
    """A promql_expr_test: expr (rounded) at `at` gives these values per task."""
    samples = [
        {"labels": labels(task), "value": round(x / PRECISION) * PRECISION} for task, x in values.items()
    ]
    return {"expr": rounded(expr), "eval_time": at, "exp_samples": samples}


def expect_cluster(expr: str, at: str, value: float) -> dict:
    return {
        "expr": rounded(expr),
        "eval_time": at,
        "exp_samples": [{"labels": _braces(run_labels()), "value": round(value / PRECISION) * PRECISION}],
    }


def steps_expectations(status_query: str) -> list[dict]:
    """While the short run is in the 1 minute window (30s) and after it (100s): the long run's clock
    rate, not its 12.5 steps per second of step time (at 30s too: the steps since its first sampled
    step, not over the whole minute, which holds the start-up); the short run (done, seen by one
    scrape) has no rate to show."""
    long = LONG["steps_per_interval"] / INTERVAL
    restarted = RESTARTED["task"]
    return [
        expect(status_query, "30s", {"worker-0": long, GONE["task"]: long, restarted: long}),
        expect(status_query, "100s", {"worker-0": long, GONE["task"]: long, restarted: long}),
        # Across the restart: positive and no more than the pace (the pause is in the window).
        expect(between(status_query, 0, long), "180s", {"worker-0": 1, GONE["task"]: 1, restarted: 1}),
        expect(status_query, "235s", {"worker-0": long, GONE["task"]: long, restarted: long}),
    ]


def rate_tests() -> dict:
    from monitoring import status  # the queries `make status` really sends

    long = LONG["steps_per_interval"] / INTERVAL
    outside = 1 / long - LONG["step"]
    algbw = LONG["bytes_per_step"] / LONG["allreduce"]
    world = LONG["world"]
    tests = [
        # the chief is done, seen by one scrape: no rate; the gone task its run's
        expect(r.STEPS_PER_SECOND, "100s", {"worker-0": long, GONE["task"]: long, RESTARTED["task"]: long}),
        expect(r.STEPS_PER_SECOND_RUN, "100s", {"worker-0": long, GONE["task"]: long}),
        expect_cluster(r.CLUSTER_STEPS, "100s", long),
        expect(r.OUTSIDE, "100s", {"worker-0": outside}),
        expect(r.OUTSIDE_SHARE, "100s", {"worker-0": outside * long}),
        expect(r.ALGBW, "100s", {"worker-0": algbw}),
        expect_cluster(r.CLUSTER_BUSBW, "100s", algbw * 2 * (world - 1) / world),
        expect_cluster(r.CLUSTER_EXAMPLES, "100s", long * LONG["examples_per_step"]),
        *steps_expectations(status.QUERIES["steps/s"]),
        *steps_expectations(status.queries(r.selector(PROJECT, RUN))["steps/s"]),
    ]
    group = {
        "name": "steps per second",
        "interval": f"{INTERVAL}s",
        "input_series": short_run_series() + long_run_series() + gone_run_series() + restarted_run_series(),
        "promql_expr_test": tests,
    }
    return {
        "rule_files": ["../rules/trainer.rules.yml"],
        "evaluation_interval": f"{INTERVAL}s",
        "tests": [group],
    }
