"""Training overview: is the cluster training, how fast, and where does each task's step time go?"""

import itertools

import contract as c
from monitoring import rules as r
from monitoring import verdict

from .panels import (
    GREEN,
    JOB,
    RUN_SEL,
    TASK_LEGEND,
    graph,
    labels_table,
    new_dashboard,
    project_variable,
    row,
    run_variable,
    scoped,
    single,
    step_quantile,
    task_variable,
    value_names,
)

UID = "trainer-overview"

# The codes of monitoring/verdict.py, which the generated verdict rules record.
VERDICT_COLOURS = {
    verdict.HEALTHY: "green",
    verdict.COMMUNICATION: "orange",
    verdict.INPUT: "orange",
    verdict.STRAGGLER: "orange",
    verdict.MISMATCH: "red",
    verdict.STALLED: "red",
    verdict.DOWN: "red",
}
VERDICTS = {code: (verdict.NAMES[code], colour) for code, colour in VERDICT_COLOURS.items()}


# The graphs use Grafana's rate interval (follows zoom, reacts within 20 s); the stats above them
# show the 1 min recording rules that alerts and `make diagnose` use.
EXAMPLES_RATE = f"rate({c.EXAMPLES.name}{{{JOB}}}[$__rate_interval])"
# Steps per second of step time, as the rules and `make status` compute it (monitoring/rules.py).
STEPS_RATE = r.steps_per_second("$__rate_interval", RUN_SEL)
PCT = "{:.0%}".format
TASK_SEL = "{" + JOB + ', instance=~"$task"}'


def build():
    ids = itertools.count(1)
    d = new_dashboard(
        UID,
        "Training overview",
        "Synchronous multi-worker TensorFlow training: throughput, loss, and where every task's step "
        "time goes (compute, all-reduce, input wait). Numbers come from the Prometheus recording rules "
        "that the alerts and `make diagnose` also use.",
    )
    d = d.with_variable(project_variable()).with_variable(run_variable())
    d = d.with_variable(task_variable(multi=True))

    d = d.with_row(row(ids, "Verdict"))
    d = d.with_panel(
        single(
            ids,
            "Verdict",
            "Why training is slow, the same verdict as `make diagnose`: healthy, "
            f"communication-bound (all-reduce > {PCT(verdict.ALLREDUCE_SHARE)} of every task's step: larger "
            "per-replica batch, gradient packing, faster network), input-bound (input wait > "
            f"{PCT(verdict.INPUT_SHARE)}: prefetch, parallel map, cache, more files), straggler (one task's "
            f"compute > {verdict.STRAGGLER_RATIO:g}x the others': check that task's host), mismatch (tasks run different versions: rebuild), stalled or down. Run `make diagnose` for "
            "the evidence and advice.",
            "none",
            f"{r.CLUSTER_VERDICT_CODE}{{{JOB}}}",
            legend="cluster",
            w=8,
            limits=(GREEN, (verdict.COMMUNICATION, "orange"), (verdict.MISMATCH, "red")),
        ).mappings(value_names(VERDICTS))
    )
    d = d.with_panel(
        labels_table(
            ids,
            "Verdict per task",
            "The verdict of every task: the task named input-bound or straggler is where to look first.",
            f"{r.VERDICT_NAMED}{{{JOB}}}",
            hide=("instance",),
            w=16,
            h=4,
        )
    )

    d = d.with_row(row(ids, "Cluster"))
    d = d.with_panel(
        single(
            ids,
            "Throughput",
            "Examples per second of step time over all tasks (1 min). Low or falling "
            "while the loss still moves: look at the step breakdown below for the part that grew.",
            "suffix: ex/s",
            scoped(r.CLUSTER_EXAMPLES),
            legend="cluster",
        )
    )
    d = d.with_panel(
        single(
            ids,
            "Steps per second",
            "Synchronous steps per second of step time (the slowest task's, last "
            "minute); after the run, over the whole run. No value while the tasks are up means training "
            "is stalled: check Task state and the TrainingStalled alert.",
            "suffix: steps/s",
            f"{scoped(r.CLUSTER_STEPS)} or {scoped(r.CLUSTER_STEPS_RUN)}",
            legend="cluster",
        )
    )
    d = d.with_panel(
        single(
            ids,
            "Global step",
            "Highest step any task has reached; it continues from the checkpoint after "
            "a restart. Not moving while tasks are up: training is stalled (see Task state).",
            "none",
            f"max({c.GLOBAL_STEP.name}{{{JOB}}})",
            legend="step",
        )
    )
    d = d.with_panel(
        single(
            ids,
            "Straggler ratio",
            "Slowest task's compute time per step / the others' (their median). "
            f"1.0 is balanced; above {verdict.STRAGGLER_RATIO:g} one task holds everyone back (the others "
            "wait for it in all-reduce): find it in 'Compute time vs. the others' and check its host.",
            "x",
            scoped(r.STRAGGLER_RATIO),
            legend="cluster",
            limits=(
                GREEN,
                (1 + (verdict.STRAGGLER_RATIO - 1) / 2, "yellow"),
                (verdict.STRAGGLER_RATIO, "red"),
            ),
        )
    )
    d = d.with_panel(
        single(
            ids,
            "All-reduce bus bandwidth",
            "Best task's all-reduce bus bandwidth (nccl-tests busbw = "
            "algbw x 2(n-1)/n): comparable with the link's own speed. Far below `make bench-comm` "
            "means all-reduce waits for a straggler or is badly packed.",
            "Bps",
            scoped(r.CLUSTER_BUSBW),
            legend="cluster",
        )
    )
    d = d.with_panel(
        single(
            ids,
            "Firing alerts",
            "Alerts firing now (TrainerDown, TrainingStalled, Straggler, InputBound, "
            "CommunicationBound, LossNotFinite). Anything above 0: read the table at the bottom.",
            "none",
            f'count(ALERTS{{alertstate="firing", {JOB}}}) or vector(0)',
            legend="firing",
            limits=(GREEN, (1, "red")),
        )
    )

    d = d.with_panel(
        graph(
            ids,
            "Throughput",
            "Examples per second: the cluster total and each task's share. Tasks should "
            "be equal (each processes its own shard of the global batch); a lower task has a smaller "
            "batch or restarted.",
            "suffix: ex/s",
            [
                (f"sum by ({r.BY_RUN}) ({EXAMPLES_RATE})", "cluster"),
                (f"sum by ({r.BY_TASK}) ({EXAMPLES_RATE})", TASK_LEGEND),
            ],
        )
    )
    d = d.with_panel(
        graph(
            ids,
            "Loss",
            "Training loss reported by each task. It should fall; flat from the start means "
            "the learning rate is too low or the data is not learnable, NaN/Inf fires LossNotFinite.",
            "none",
            [(r.loss_after_first_step(RUN_SEL), TASK_LEGEND)],
            min_zero=False,
        )
    )
    d = d.with_panel(
        graph(
            ids,
            "Step time p50 / p95 per task",
            "Wall time of a whole step per task, median and 95th "
            "percentile. All tasks show nearly the same time in synchronous training; a wide p95 "
            "against p50 means jitter (a noisy neighbour, garbage collection, checkpointing).",
            "s",
            [
                (step_quantile(0.5, JOB), TASK_LEGEND + " p50"),
                (step_quantile(0.95, JOB), TASK_LEGEND + " p95"),
            ],
        )
    )
    d = d.with_panel(
        graph(
            ids,
            "Steps per second",
            "Synchronous steps per second of step time, per task (they should "
            "agree). A gap while tasks are up is a stall.",
            "suffix: steps/s",
            [(STEPS_RATE, TASK_LEGEND)],
        )
    )

    d = d.with_row(row(ids, "Where step time goes"))
    d = d.with_panel(
        graph(
            ids,
            "Step breakdown: $task",
            "Mean seconds per step on this task, stacked: compute (forward and "
            "backward), all-reduce (gradient exchange, including waiting for the slowest task), input "
            "wait, and other (dispatch overhead the parts do not cover). The largest band is the "
            "bottleneck; 'other' above a few ms means the step is too small to be worth distributing.",
            "s",
            [
                (r.MEAN[c.COMPUTE] + TASK_SEL, TASK_LEGEND + " compute"),
                (r.MEAN[c.ALLREDUCE] + TASK_SEL, TASK_LEGEND + " all-reduce"),
                (r.MEAN[c.INPUT_WAIT] + TASK_SEL, TASK_LEGEND + " input wait"),
                (r.OTHER + TASK_SEL, TASK_LEGEND + " other"),
            ],
            w=24,
            stacked=True,
        )
        .repeat("task")
        .repeat_direction("h")
        .max_per_row(4)
    )
    d = d.with_panel(
        graph(
            ids,
            "All-reduce share of step time",
            "Fraction of each task's step spent in the gradient "
            f"all-reduce. Above {PCT(verdict.ALLREDUCE_SHARE)} (dashed line) on every task: "
            "communication-bound, use a larger per-replica batch, gradient packing or a faster network. "
            "High on all but one task: that one is a straggler.",
            "percentunit",
            [(scoped(r.SHARE[c.ALLREDUCE]), TASK_LEGEND)],
            w=8,
            limits=(GREEN, (verdict.ALLREDUCE_SHARE, "red")),
        )
    )
    d = d.with_panel(
        graph(
            ids,
            "Input-wait share of step time",
            "Fraction of each task's step spent waiting for the next "
            f"batch. Above {PCT(verdict.INPUT_SHARE)} (dashed line): input-bound, add prefetch, parallel "
            "map/interleave, caching, or more files for FILE sharding.",
            "percentunit",
            [(scoped(r.SHARE[c.INPUT_WAIT]), TASK_LEGEND)],
            w=8,
            limits=(GREEN, (verdict.INPUT_SHARE, "red")),
        )
    )
    d = d.with_panel(
        graph(
            ids,
            "Compute time vs. the others (straggler)",
            "Each task's compute time per step divided by "
            f"the others' (the median task once the slowest is set aside). A task above "
            f"{verdict.STRAGGLER_RATIO:g} (dashed line) is a straggler: everyone else waits for it. "
            "Check its CPU/GPU, container limits and neighbours.",
            "x",
            [(scoped(r.COMPUTE_RATIO), TASK_LEGEND)],
            w=8,
            limits=(GREEN, (verdict.STRAGGLER_RATIO, "red")),
        )
    )

    d = d.with_row(row(ids, "Communication"))
    d = d.with_panel(
        graph(
            ids,
            "All-reduce bandwidth per task",
            "Bus bandwidth (busbw) and algorithm bandwidth (algbw) "
            "of the gradient all-reduce, nccl-tests definitions. busbw near the link's speed (see `make "
            "bench-comm`) means the network is the limit; far below it on one task means it waits for "
            "others.",
            "Bps",
            [(scoped(r.BUSBW), TASK_LEGEND + " busbw"), (scoped(r.ALGBW), TASK_LEGEND + " algbw")],
        )
    )
    d = d.with_panel(
        graph(
            ids,
            "Network traffic per task",
            "Bytes per second sent and received by each task's network "
            "namespace (its container). Should be about equal across tasks for ring all-reduce; one "
            "task far higher is doing extra work (e.g. the chief writing checkpoints to a network disk).",
            "Bps",
            [
                (scoped(r.NET_RATE[c.NET_TRANSMIT]), TASK_LEGEND + " sent"),
                (scoped(r.NET_RATE[c.NET_RECEIVE]), TASK_LEGEND + " received"),
            ],
        )
    )

    d = d.with_row(row(ids, "Tasks"))
    d = d.with_panel(
        labels_table(
            ids,
            "Build info per task",
            "Versions and configuration of every task. All rows must agree "
            "(TensorFlow, trainer version, strategy, communication, model task); a differing row "
            "means a stale image: rebuild and restart the cluster.",
            f"last_over_time({r.BUILD_INFO}{{{JOB}}}[$__range])",
            hide=("instance",),
            w=16,
        )
    )
    d = d.with_panel(
        labels_table(
            ids,
            "Task state",
            "Last known state of every task in the time range (starting, "
            "waiting_for_peers, training, checkpointing, done, failed). A task stuck in waiting_for_peers "
            "cannot reach a peer: see its log for the missing address.",
            f"last_over_time({c.STATE.name}{{{JOB}}}[$__range]) == 1",
            hide=("instance",),
            w=8,
        )
    )
    d = d.with_panel(
        labels_table(
            ids,
            "Firing alerts",
            "Alerts firing now, with the task they name. Empty is good. The alert "
            "descriptions in Prometheus (/alerts) say what to do.",
            f'ALERTS{{alertstate="firing", {JOB}}}',
            hide=("alertstate",),
            w=24,
            h=6,
        )
    )
    return d
