"""Every query of every committed dashboard panel, run against the live Prometheus of the compose
stack after real training: each must return finite data, for every task where it is per task.
Dashboards and metric names can then never drift apart silently.

Queries are sent the way Grafana sends them: `$__rate_interval`, `$__interval`, `$__range` and the
dashboard variables substituted, range queries over the run, instant (table) queries just after it."""

import time

import pytest

import contract
from monitoring.prom.client import Prometheus
from monitoring.prom.promql import (
    find_window,
    finite_series,
    load_dashboards,
    panel_queries,
    substitute,
    wait_for_data,
)
from monitoring.rules import recording as rules

pytestmark = pytest.mark.docker

SCRAPE = 5  # seconds; Prometheus' scrape_interval and Grafana's datasource timeInterval
STEP = 5
# Grafana: $__rate_interval = max($__interval + scrape interval, 4 x scrape interval).
RATE_INTERVAL = f"{max(STEP + SCRAPE, 4 * SCRAPE)}s"
# Panels that are empty on a healthy run by design; their queries must still be valid PromQL.
MAY_BE_EMPTY = {("trainer-overview", "Firing alerts", True)}
# The most derived recording rules of each kind: once they have a value for every task, every panel can
# have data. The rates from counters have one with the first scrape that saw a step; the clock's steps/s
# (and what derives from it) needs a second rule evaluation after that one (its first step is read by a
# subquery at the evaluation interval): readiness on busbw alone once queried a task's examples/s too soon.
READY = ((rules.BUSBW, "task"), (rules.EXAMPLES_PER_SECOND, "task"), (rules.CLUSTER_STEPS, "job"))


@pytest.fixture(scope="module")
def trained(stack):
    """(prometheus, run window, {instance: labels}, the run's variables, the last time every task was
    scraped) once every task has trained long enough for every recording rule to have a value."""
    prom = Prometheus(url=stack.prometheus_url)
    for expr, per in READY:
        wait_for_data(prom, expr, tasks=stack.workers + 1 if per == "task" else 1, timeout=240)
    window = find_window(prom, lookback=3600, now=time.time())  # the run so far (or all of it)
    sizes = prom.query_range(
        f"{contract.WORLD_SIZE.name}{rules.JOB_SELECTOR}", window.start, window.end, STEP
    )
    tasks = finite_series(sizes)
    assert sorted((contract.task_of(m) for m in tasks.values()), key=contract.task_order) == [
        contract.CHIEF
    ] + [contract.task_name(contract.WORKER, i) for i in range(stack.workers)]
    return prom, window, tasks, run_variables(stack.run_dir), last_common_sample(prom, window)


def last_common_sample(prom: Prometheus, window) -> float:
    """The last time every task's step was scraped: the earliest of the tasks' last samples. A task's
    series can outlast its peers' by a minute, and the window ends with the last of them (CI, load 38:
    at the window's end the chief's and worker-0's verdicts were gone, worker-1's was there)."""
    stamps = prom.query_range(
        f"timestamp({contract.GLOBAL_STEP.name}{rules.JOB_SELECTOR})", window.start, window.end, STEP
    )
    return min(max(float(v) for _, v in s["values"]) for s in stamps)


def run_variables(run_dir) -> dict[str, str]:
    """What Grafana's Project and Run variables hold for this stack: its project and the run id its
    `make up` created (stack.env), as every panel query selects one run of one stack."""
    env = dict(line.split("=", 1) for line in (run_dir / "stack.env").read_text().splitlines() if "=" in line)
    assert env.get("RUN"), f"no RUN= in {run_dir / 'stack.env'}"
    return {"project": env.get("COMPOSE_PROJECT_NAME", contract.DEFAULT_PROJECT), "run": env["RUN"]}


def cases() -> list:
    return [
        pytest.param(q, id=f"{q.dashboard}:{q.panel}:{q.ref_id}")
        for dashboard in load_dashboards().values()
        for q in panel_queries(dashboard)
    ]


def variable_choices(q, instances: list[str]) -> list[dict[str, str]]:
    """What Grafana substitutes for $task: each task in turn where the panel shows one task (Task
    detail, repeated panels), otherwise "All" (a regex of every instance)."""
    if "$task" not in q.expr:
        return [{}]
    if q.dashboard == "trainer-task" or q.repeat == "task":
        return [{"task": i} for i in instances]
    return [{"task": "|".join(instances)}]


@pytest.mark.parametrize("q", cases())
def test_panel_query_returns_data_for_every_task(trained, q):
    prom, window, tasks, run, common_end = trained
    for choice in variable_choices(q, sorted(tasks)):
        variables = {**run, **choice}
        scoped = variables.get("task")
        want = {i for i in tasks if not scoped or i in scoped.split("|")}
        # Instant (table) queries: as seen shortly after the run, when the tasks have exited. A 1 min
        # rule of a task outlives its last step by about a minute, and the tasks stop a few seconds
        # apart: a ~10 s run (the session stack's, idle CI) once had one task's verdict gone at +30 s.
        # Where one task outlived the others by more, as seen when every task had just been scraped.
        ends = dict.fromkeys((window.end + 30, window.end + 15, window.end, common_end + 15, common_end))
        for at in ends:
            expr = substitute(
                q.expr,
                rate_interval=RATE_INTERVAL,
                interval=f"{STEP}s",
                range_=f"{at - window.start + STEP:.0f}s",
                variables=variables,
            )
            if not q.instant:
                result = prom.query_range(expr, window.start, window.end + 60, STEP)
                break
            result = prom.query(expr, at=at)
            if set(finite_series(result)) >= want:
                break
        if (q.dashboard, q.panel, q.instant) in MAY_BE_EMPTY:
            continue  # the query ran without error; empty is the healthy answer
        got = finite_series(result)
        assert got, f"{q.panel} [{q.ref_id}] returned no finite data: {expr}"
        if any("task_type" in m for m in got.values()):  # per task: every task in scope has data
            assert set(got) == want, f"{q.panel} [{q.ref_id}]: {sorted(got)}, want {sorted(want)}: {expr}"
