"""Task detail: one task's state, step time and its parts, bandwidth and traffic."""

from grafana_foundation_sdk.models import common

import contract as c
from monitoring.rules import recording as r
from monitoring.verdicts import verdict

from .panels import (
    GREEN,
    JOB,
    TASK_LEGEND,
    Graph,
    Row,
    Stat,
    Table,
    assemble,
    new_dashboard,
    project_variable,
    run_variable,
    step_quantile,
    task_variable,
)

UID = "trainer-task"
SEL = f'{JOB}, instance="$task"'
PCT = "{:.0%}".format


def mean(part: c.Metric) -> str:
    """Mean seconds per step of one histogram, over Grafana's rate interval."""
    return (
        f"sum by ({r.BY_TASK}) (rate({part.sum}{{{SEL}}}[$__rate_interval])) / "
        f"sum by ({r.BY_TASK}) (rate({part.count}{{{SEL}}}[$__rate_interval]))"
    )


def sel(rule: str) -> str:
    return f"{rule}{{{SEL}}}"


PANELS = (
    Row(title="$task"),
    Stat(
        title="State",
        description="The task's state. training is normal; waiting_for_peers for long means a peer "
        "is unreachable (its log names it); failed: read this task's log.",
        unit="none",
        expr=f"{sel(c.STATE.name)} == 1",
        legend=f"{{{{{c.STATE.client_name}}}}}",
        text_mode=common.BigValueTextMode.NAME,
    ),
    Stat(
        title="Global step",
        description="Steps this task has completed (continues from the checkpoint after a restart).",
        unit="none",
        expr=sel(c.GLOBAL_STEP.name),
    ),
    Stat(
        title="Time since last step",
        description=f"Seconds since this task finished a step. Over "
        f"{verdict.STALL_SECONDS:g} s while not done fires TrainingStalled: a peer died or hangs in a collective.",
        unit="s",
        expr=sel(r.LAST_STEP_AGE),
        limits=(GREEN, (verdict.STALL_SECONDS / 4, "yellow"), (verdict.STALL_SECONDS, "red")),
    ),
    Stat(
        title="Last checkpoint step",
        description="Step of the last checkpoint: a restart resumes here and loses the "
        "steps after it. Far behind the global step: lower --save-every.",
        unit="none",
        expr=sel(c.LAST_CHECKPOINT.name),
    ),
    Stat(
        title="World size",
        description="Number of tasks taking part in the all-reduce. Must equal chief + workers.",
        unit="none",
        expr=sel(c.WORLD_SIZE.name),
    ),
    Stat(
        title="Examples per second",
        description="This task's examples per second of wall-clock time (last minute).",
        unit="suffix: ex/s",
        expr=sel(r.EXAMPLES_PER_SECOND),
    ),
    Graph(
        title="Step time quantiles",
        description="Wall time of a whole step: median, 95th and 99th percentile. A "
        "p99 far above p50 means occasional long steps (checkpoints, GC, a noisy neighbour).",
        unit="s",
        exprs=tuple((step_quantile(q, SEL), f"p{round(q * 100)}") for q in (0.5, 0.95, 0.99)),
    ),
    Graph(
        title="Step breakdown",
        description="Mean seconds per step, stacked: compute, all-reduce (includes waiting "
        "for the slowest task), input wait and other (dispatch overhead the parts do not cover), so "
        "the top of the stack is the whole step. The largest band is this task's bottleneck.",
        unit="s",
        exprs=(
            (mean(c.COMPUTE), "compute"),
            (mean(c.ALLREDUCE), "all-reduce"),
            (mean(c.INPUT_WAIT), "input wait"),
            (" - ".join(mean(m) for m in (c.STEP, c.COMPUTE, c.ALLREDUCE, c.INPUT_WAIT)), "other"),
        ),
        stacked=True,
    ),
    Graph(
        title="Share of step time",
        description="Fraction of the step in all-reduce (communication-bound above "
        f"{PCT(verdict.ALLREDUCE_SHARE)}) and in input wait (input-bound above {PCT(verdict.INPUT_SHARE)}).",
        unit="percentunit",
        exprs=(
            (sel(r.SHARE[c.ALLREDUCE]), "all-reduce"),
            (sel(r.SHARE[c.INPUT_WAIT]), "input wait"),
            (sel(r.SHARE[c.COMPUTE]), "compute"),
        ),
        limits=(GREEN, (verdict.INPUT_SHARE, "yellow"), (verdict.ALLREDUCE_SHARE, "red")),
    ),
    Graph(
        title="Loss",
        description="This task's training loss. It should fall; NaN or Inf fires LossNotFinite.",
        unit="none",
        exprs=((r.loss_after_first_step(f"{{{SEL}}}"), TASK_LEGEND),),
        min_zero=False,
    ),
    Graph(
        title="All-reduce bandwidth",
        description="Algorithm and bus bandwidth of this task's gradient all-reduce "
        "(nccl-tests definitions). Lower than on the other tasks: this task waits for a straggler.",
        unit="Bps",
        exprs=((sel(r.BUSBW), "busbw"), (sel(r.ALGBW), "algbw")),
    ),
    Graph(
        title="Network traffic",
        description="Bytes per second sent and received by this task's container.",
        unit="Bps",
        exprs=((sel(r.NET_RATE[c.NET_TRANSMIT]), "sent"), (sel(r.NET_RATE[c.NET_RECEIVE]), "received")),
    ),
    Table(
        title="Build info",
        description="This task's versions and configuration; must match every other task's (see Training overview).",
        expr=f"last_over_time({sel(r.BUILD_INFO)}[$__range])",
        w=24,
        h=4,
    ),
)
"""The dashboard, panel by panel in layout order."""


def build():
    d = new_dashboard(
        UID, "Task detail", "One trainer task (chief or worker) in detail: pick it with the Task variable."
    )
    d = d.with_variable(project_variable()).with_variable(run_variable())
    return assemble(d.with_variable(task_variable(multi=False)), PANELS)
