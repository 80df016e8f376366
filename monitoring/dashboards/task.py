"""Task detail: one task's state, step time and its parts, bandwidth and traffic."""

import itertools

from grafana_foundation_sdk.models import common

import contract as c
from monitoring import rules as r
from monitoring import verdict

from .panels import (
    GREEN,
    JOB,
    TASK_LEGEND,
    graph,
    labels_table,
    new_dashboard,
    project_variable,
    row,
    run_variable,
    single,
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


def build():
    ids = itertools.count(1)
    d = new_dashboard(
        UID,
        "Task detail",
        "One trainer task (chief or worker) in detail: pick it with the Task variable.",
    )
    d = d.with_variable(project_variable()).with_variable(run_variable())
    d = d.with_variable(task_variable(multi=False))

    d = d.with_row(row(ids, "$task"))
    d = d.with_panel(
        single(
            ids,
            "State",
            "The task's state. training is normal; waiting_for_peers for long means a peer "
            "is unreachable (its log names it); failed: read this task's log.",
            "none",
            f"{sel(c.STATE.name)} == 1",
            legend=f"{{{{{c.STATE.client_name}}}}}",
            text_mode=common.BigValueTextMode.NAME,
        )
    )
    d = d.with_panel(
        single(
            ids,
            "Global step",
            "Steps this task has completed (continues from the checkpoint after a restart).",
            "none",
            sel(c.GLOBAL_STEP.name),
        )
    )
    d = d.with_panel(
        single(
            ids,
            "Time since last step",
            f"Seconds since this task finished a step. Over "
            f"{verdict.STALL_SECONDS:g} s while not done fires TrainingStalled: a peer died or hangs in a collective.",
            "s",
            sel(r.LAST_STEP_AGE),
            limits=(GREEN, (verdict.STALL_SECONDS / 4, "yellow"), (verdict.STALL_SECONDS, "red")),
        )
    )
    d = d.with_panel(
        single(
            ids,
            "Last checkpoint step",
            "Step of the last checkpoint: a restart resumes here and loses the "
            "steps after it. Far behind the global step: lower --save-every.",
            "none",
            sel(c.LAST_CHECKPOINT.name),
        )
    )
    d = d.with_panel(
        single(
            ids,
            "World size",
            "Number of tasks taking part in the all-reduce. Must equal chief + workers.",
            "none",
            sel(c.WORLD_SIZE.name),
        )
    )
    d = d.with_panel(
        single(
            ids,
            "Examples per second",
            "This task's examples per second of step time (last minute).",
            "suffix: ex/s",
            sel(r.EXAMPLES_PER_SECOND),
        )
    )

    d = d.with_panel(
        graph(
            ids,
            "Step time quantiles",
            "Wall time of a whole step: median, 95th and 99th percentile. A "
            "p99 far above p50 means occasional long steps (checkpoints, GC, a noisy neighbour).",
            "s",
            [(step_quantile(q, SEL), f"p{round(q * 100)}") for q in (0.5, 0.95, 0.99)],
        )
    )
    d = d.with_panel(
        graph(
            ids,
            "Step breakdown",
            "Mean seconds per step, stacked: compute, all-reduce (includes waiting "
            "for the slowest task), input wait and other (dispatch overhead the parts do not cover), so "
            "the top of the stack is the whole step. The largest band is this task's bottleneck.",
            "s",
            [
                (mean(c.COMPUTE), "compute"),
                (mean(c.ALLREDUCE), "all-reduce"),
                (mean(c.INPUT_WAIT), "input wait"),
                (" - ".join(mean(m) for m in (c.STEP, c.COMPUTE, c.ALLREDUCE, c.INPUT_WAIT)), "other"),
            ],
            stacked=True,
        )
    )
    d = d.with_panel(
        graph(
            ids,
            "Share of step time",
            "Fraction of the step in all-reduce (communication-bound above "
            f"{PCT(verdict.ALLREDUCE_SHARE)}) and in input wait (input-bound above {PCT(verdict.INPUT_SHARE)}).",
            "percentunit",
            [
                (sel(r.SHARE[c.ALLREDUCE]), "all-reduce"),
                (sel(r.SHARE[c.INPUT_WAIT]), "input wait"),
                (sel(r.SHARE[c.COMPUTE]), "compute"),
            ],
            limits=(GREEN, (verdict.INPUT_SHARE, "yellow"), (verdict.ALLREDUCE_SHARE, "red")),
        )
    )
    d = d.with_panel(
        graph(
            ids,
            "Loss",
            "This task's training loss. It should fall; NaN or Inf fires LossNotFinite.",
            "none",
            [(r.loss_after_first_step(f"{{{SEL}}}"), TASK_LEGEND)],
            min_zero=False,
        )
    )
    d = d.with_panel(
        graph(
            ids,
            "All-reduce bandwidth",
            "Algorithm and bus bandwidth of this task's gradient all-reduce "
            "(nccl-tests definitions). Lower than on the other tasks: this task waits for a straggler.",
            "Bps",
            [(sel(r.BUSBW), "busbw"), (sel(r.ALGBW), "algbw")],
        )
    )
    d = d.with_panel(
        graph(
            ids,
            "Network traffic",
            "Bytes per second sent and received by this task's container.",
            "Bps",
            [(sel(r.NET_RATE[c.NET_TRANSMIT]), "sent"), (sel(r.NET_RATE[c.NET_RECEIVE]), "received")],
        )
    )
    d = d.with_panel(
        labels_table(
            ids,
            "Build info",
            "This task's versions and configuration; must match every other task's (see Training overview).",
            f"last_over_time({sel(r.BUILD_INFO)}[$__range])",
            w=24,
            h=4,
        )
    )
    return d
