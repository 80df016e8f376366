"""Training overview: is the cluster training, how fast, and where does each task's step time go?"""

import contract as c
from monitoring.rules import recording as r
from monitoring.verdicts import verdict

from .panels import (
    GREEN,
    JOB,
    RUN_SEL,
    TASK_LEGEND,
    Graph,
    Row,
    Stat,
    Table,
    assemble,
    new_dashboard,
    project_variable,
    run_variable,
    scoped,
    step_quantile,
    task_variable,
)

UID = "trainer-overview"

# The codes of monitoring/verdicts/verdict.py, which the generated verdict rules record.
VERDICT_COLOURS = {
    verdict.HEALTHY: "green",
    verdict.COMMUNICATION: "orange",
    verdict.INPUT: "orange",
    verdict.STRAGGLER: "orange",
    verdict.MISMATCH: "red",
    verdict.STALLED: "red",
    verdict.STUCK: "red",
    verdict.DOWN: "red",
}
VERDICTS = {code: (verdict.NAMES[code], colour) for code, colour in VERDICT_COLOURS.items()}


# The graphs use Grafana's rate interval (follows zoom, reacts within 20 s); the stats above them
# show the 1 min recording rules that alerts and `make diagnose` use.
EXAMPLES_RATE = f"rate({c.EXAMPLES.name}{{{JOB}}}[$__rate_interval])"
# Steps per second as the clock sees them, as the rules and `make status` compute it (monitoring/rules/recording.py).
STEPS_RATE = r.steps_per_second("$__rate_interval", RUN_SEL)
PCT = "{:.0%}".format
TASK_SEL = "{" + JOB + ', instance=~"$task"}'


PANELS = (
    Row(title="Verdict"),
    Stat(
        title="Verdict",
        description="Why training is slow, the same verdict as `make diagnose`: healthy, "
        f"communication-bound (all-reduce > {PCT(verdict.ALLREDUCE_SHARE)} of every task's step: larger "
        "per-replica batch, gradient packing, faster network), input-bound (input wait > "
        f"{PCT(verdict.INPUT_SHARE)}: prefetch, parallel map, cache, more files), straggler (one task's "
        f"compute > {verdict.STRAGGLER_RATIO:g}x the others': check that task's host), mismatch (tasks run different versions: rebuild), stalled or down. Run `make diagnose` for "
        "the evidence and advice.",
        unit="none",
        expr=f"{r.CLUSTER_VERDICT_CODE}{{{JOB}}}",
        legend="cluster",
        w=8,
        limits=(GREEN, (verdict.COMMUNICATION, "orange"), (verdict.MISMATCH, "red")),
        names=VERDICTS,
    ),
    Table(
        title="Verdict per task",
        description="The verdict of every task: the task named input-bound or straggler is where to look first.",
        expr=f"{r.VERDICT_NAMED}{{{JOB}}}",
        hide=("instance",),
        w=16,
        h=4,
    ),
    Row(title="Cluster"),
    Stat(
        title="Throughput",
        description="Examples per second of wall-clock time over all tasks (1 min). Low or falling "
        "while the loss still moves: look at the step breakdown below for the part that grew.",
        unit="suffix: ex/s",
        expr=scoped(r.CLUSTER_EXAMPLES),
        legend="cluster",
    ),
    Stat(
        title="Steps per second",
        description="Synchronous steps per second as the clock sees them, time between steps "
        "(saves, host work) included (the slowest task's, last minute); after the run, over the whole run. No value while the tasks are up means training "
        "is stalled: check Task state and the TrainingStalled alert.",
        unit="suffix: steps/s",
        expr=f"{scoped(r.CLUSTER_STEPS)} or {scoped(r.CLUSTER_STEPS_RUN)}",
        legend="cluster",
    ),
    Stat(
        title="Global step",
        description="Highest step any task has reached; it continues from the checkpoint after "
        "a restart. Not moving while tasks are up: training is stalled (see Task state).",
        unit="none",
        expr=f"max({c.GLOBAL_STEP.name}{{{JOB}}})",
        legend="step",
    ),
    Stat(
        title="Straggler ratio",
        description="Slowest task's compute time per step / the others' (their median). "
        f"1.0 is balanced; above {verdict.STRAGGLER_RATIO:g} one task holds everyone back (the others "
        "wait for it in all-reduce): find it in 'Compute time vs. the others' and check its host.",
        unit="x",
        expr=scoped(r.STRAGGLER_RATIO),
        legend="cluster",
        limits=(GREEN, (1 + (verdict.STRAGGLER_RATIO - 1) / 2, "yellow"), (verdict.STRAGGLER_RATIO, "red")),
    ),
    Stat(
        title="All-reduce bus bandwidth",
        description="Best task's all-reduce bus bandwidth (nccl-tests busbw = "
        "algbw x 2(n-1)/n): comparable with the link's own speed. Far below `make bench-comm` "
        "means all-reduce waits for a straggler or is badly packed.",
        unit="Bps",
        expr=scoped(r.CLUSTER_BUSBW),
        legend="cluster",
    ),
    Stat(
        title="Firing alerts",
        description="Alerts firing now (TrainerDown, TrainingStalled, Straggler, InputBound, "
        "CommunicationBound, LossNotFinite). Anything above 0: read the table at the bottom.",
        unit="none",
        expr=f'count(ALERTS{{alertstate="firing", {JOB}}}) or vector(0)',
        legend="firing",
        limits=(GREEN, (1, "red")),
    ),
    Graph(
        title="Throughput",
        description="Examples per second: the cluster total and each task's share. Tasks should "
        "be equal (each processes its own shard of the global batch); a lower task has a smaller "
        "batch or restarted.",
        unit="suffix: ex/s",
        exprs=(
            (f"sum by ({r.BY_RUN}) ({EXAMPLES_RATE})", "cluster"),
            (f"sum by ({r.BY_TASK}) ({EXAMPLES_RATE})", TASK_LEGEND),
        ),
    ),
    Graph(
        title="Loss",
        description="Training loss reported by each task. It should fall; flat from the start means "
        "the learning rate is too low or the data is not learnable, NaN/Inf fires LossNotFinite.",
        unit="none",
        exprs=((r.loss_after_first_step(RUN_SEL), TASK_LEGEND),),
        min_zero=False,
    ),
    Graph(
        title="Step time p50 / p95 per task",
        description="Wall time of a whole step per task, median and 95th "
        "percentile. All tasks show nearly the same time in synchronous training; a wide p95 "
        "against p50 means jitter (a noisy neighbour, garbage collection, checkpointing).",
        unit="s",
        exprs=(
            (step_quantile(0.5, JOB), TASK_LEGEND + " p50"),
            (step_quantile(0.95, JOB), TASK_LEGEND + " p95"),
        ),
    ),
    Graph(
        title="Steps per second",
        description="Synchronous steps per second as the clock sees them, per task (they should "
        "agree). A gap while tasks are up is a stall.",
        unit="suffix: steps/s",
        exprs=((STEPS_RATE, TASK_LEGEND),),
    ),
    Row(title="Where step time goes"),
    Graph(
        title="Step breakdown: $task",
        description="Mean seconds per step on this task, stacked: compute (forward and "
        "backward), all-reduce (gradient exchange, including waiting for the slowest task), input "
        "wait, and other (dispatch overhead the parts do not cover); the time between steps (saves, "
        "host work) is `make status`'s outside-steps share. The largest band is the bottleneck; "
        "'other' above a few ms means the step is too small to be worth distributing.",
        unit="s",
        exprs=(
            (r.MEAN[c.COMPUTE] + TASK_SEL, TASK_LEGEND + " compute"),
            (r.MEAN[c.ALLREDUCE] + TASK_SEL, TASK_LEGEND + " all-reduce"),
            (r.MEAN[c.INPUT_WAIT] + TASK_SEL, TASK_LEGEND + " input wait"),
            (r.OTHER + TASK_SEL, TASK_LEGEND + " other"),
        ),
        w=24,
        stacked=True,
        repeat="task",
    ),
    Graph(
        title="All-reduce share of step time",
        description="Fraction of each task's step spent in the gradient "
        f"all-reduce. Above {PCT(verdict.ALLREDUCE_SHARE)} (dashed line) on every task: "
        "communication-bound, use a larger per-replica batch, gradient packing or a faster network. "
        "High on all but one task: that one is a straggler.",
        unit="percentunit",
        exprs=((scoped(r.SHARE[c.ALLREDUCE]), TASK_LEGEND),),
        w=8,
        limits=(GREEN, (verdict.ALLREDUCE_SHARE, "red")),
    ),
    Graph(
        title="Input-wait share of step time",
        description="Fraction of each task's step spent waiting for the next "
        f"batch. Above {PCT(verdict.INPUT_SHARE)} (dashed line): input-bound, add prefetch, parallel "
        "map/interleave, caching, or more files for FILE sharding.",
        unit="percentunit",
        exprs=((scoped(r.SHARE[c.INPUT_WAIT]), TASK_LEGEND),),
        w=8,
        limits=(GREEN, (verdict.INPUT_SHARE, "red")),
    ),
    Graph(
        title="Compute time vs. the others (straggler)",
        description="Each task's compute time per step divided by "
        f"the others' (the median task once the slowest is set aside). A task above "
        f"{verdict.STRAGGLER_RATIO:g} (dashed line) is a straggler: everyone else waits for it. "
        "Check its CPU/GPU, container limits and neighbours.",
        unit="x",
        exprs=((scoped(r.COMPUTE_RATIO), TASK_LEGEND),),
        w=8,
        limits=(GREEN, (verdict.STRAGGLER_RATIO, "red")),
    ),
    Row(title="Communication"),
    Graph(
        title="All-reduce bandwidth per task",
        description="Bus bandwidth (busbw) and algorithm bandwidth (algbw) "
        "of the gradient all-reduce, nccl-tests definitions. busbw near the link's speed (see `make "
        "bench-comm`) means the network is the limit; far below it on one task means it waits for "
        "others.",
        unit="Bps",
        exprs=((scoped(r.BUSBW), TASK_LEGEND + " busbw"), (scoped(r.ALGBW), TASK_LEGEND + " algbw")),
    ),
    Graph(
        title="Network traffic per task",
        description="Bytes per second sent and received by each task's network "
        "namespace (its container). Should be about equal across tasks for ring all-reduce; one "
        "task far higher is doing extra work (e.g. the chief writing checkpoints to a network disk).",
        unit="Bps",
        exprs=(
            (scoped(r.NET_RATE[c.NET_TRANSMIT]), TASK_LEGEND + " sent"),
            (scoped(r.NET_RATE[c.NET_RECEIVE]), TASK_LEGEND + " received"),
        ),
    ),
    Row(title="Tasks"),
    Table(
        title="Build info per task",
        description="Versions and configuration of every task. All rows must agree "
        "(TensorFlow, trainer version, strategy, communication, model task); a differing row "
        "means a stale image: rebuild and restart the cluster.",
        expr=f"last_over_time({r.BUILD_INFO}{{{JOB}}}[$__range])",
        hide=("instance",),
        w=16,
    ),
    Table(
        title="Task state",
        description="Last known state of every task in the time range (starting, "
        "waiting_for_peers, training, checkpointing, done, failed). A task stuck in waiting_for_peers "
        "cannot reach a peer: see its log for the missing address.",
        expr=f"last_over_time({c.STATE.name}{{{JOB}}}[$__range]) == 1",
        hide=("instance",),
        w=8,
    ),
    Table(
        title="Firing alerts",
        description="Alerts firing now, with the task they name. Empty is good. The alert "
        "descriptions in Prometheus (/alerts) say what to do.",
        expr=f'ALERTS{{alertstate="firing", {JOB}}}',
        hide=("alertstate",),
        w=24,
        h=6,
    ),
)
"""The dashboard, panel by panel in layout order (Grafana flows them left to right by width `w`)."""


def build():
    d = new_dashboard(
        UID,
        "Training overview",
        "Synchronous multi-worker TensorFlow training: throughput, loss, and where every task's step "
        "time goes (compute, all-reduce, input wait). Numbers come from the Prometheus recording rules "
        "that the alerts and `make diagnose` also use.",
    )
    d = d.with_variable(project_variable()).with_variable(run_variable())
    return assemble(d.with_variable(task_variable(multi=True)), PANELS)
