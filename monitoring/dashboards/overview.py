"""Training overview: is the cluster training, how fast, and where does each task's step time go?"""

import itertools

from monitoring import verdict

from .panels import (GREEN, JOB, TASK_LEGEND, graph, labels_table, new_dashboard, row, single, step_quantile,
                     task_variable, value_names)

UID = "trainer-overview"

# The codes of monitoring/verdict.py, which monitoring/prometheus/rules/verdict.yml records.
VERDICT_COLOURS = {verdict.HEALTHY: "green", verdict.COMMUNICATION: "orange", verdict.INPUT: "orange",
                   verdict.STRAGGLER: "orange", verdict.MISMATCH: "red", verdict.STALLED: "red",
                   verdict.DOWN: "red"}
VERDICTS = {code: (verdict.NAMES[code], colour) for code, colour in VERDICT_COLOURS.items()}


# The graphs use Grafana's rate interval (follows zoom, reacts within 20 s); the stats above them
# show the 1 min recording rules that alerts and `make diagnose` use.
EXAMPLES_RATE = f"rate(trainer_examples_total{{{JOB}}}[$__rate_interval])"


def build():
    ids = itertools.count(1)
    d = new_dashboard(
        UID, "Training overview",
        "Synchronous multi-worker TensorFlow training: throughput, loss, and where every task's step "
        "time goes (compute, all-reduce, input wait). Numbers come from the Prometheus recording rules "
        "that the alerts and `make diagnose` also use.",
    ).with_variable(task_variable(multi=True))

    d = d.with_row(row(ids, "Verdict"))
    d = d.with_panel(single(
        ids, "Verdict", "Why training is slow, the same verdict as `make diagnose`: healthy, "
        "communication-bound (all-reduce > 50% of every task's step: larger per-replica batch, "
        "gradient packing, faster network), input-bound (input wait > 20%: prefetch, parallel map, "
        "cache, more files), straggler (one task's compute > 1.5x the median: check that task's host), "
        "mismatch (tasks run different versions: rebuild), stalled or down. Run `make diagnose` for "
        "the evidence and advice.",
        "none", f"cluster:trainer_verdict:code{{{JOB}}}", legend="cluster", w=8,
        limits=(GREEN, (verdict.COMMUNICATION, "orange"), (verdict.MISMATCH, "red"))).mappings(value_names(VERDICTS)))
    d = d.with_panel(labels_table(
        ids, "Verdict per task", "The verdict of every task: the task named input-bound or straggler "
        "is where to look first.", f"task:trainer_verdict:named{{{JOB}}}", hide=("instance",), w=16, h=4))

    d = d.with_row(row(ids, "Cluster"))
    d = d.with_panel(single(
        ids, "Throughput", "Examples per second over all tasks (1 min rate). Low or falling while the "
        "loss still moves: look at the step breakdown below for the part that grew.",
        "suffix: ex/s", "cluster:trainer_examples:rate1m", legend="cluster"))
    d = d.with_panel(single(
        ids, "Steps per second", "Synchronous steps per second (1 min rate). 0 while the tasks are "
        "up means training is stalled: check Task state and the TrainingStalled alert.",
        "suffix: steps/s", "cluster:trainer_steps:rate1m", legend="cluster"))
    d = d.with_panel(single(
        ids, "Global step", "Highest step any task has reached; it continues from the checkpoint after "
        "a restart. Not moving while tasks are up: training is stalled (see Task state).", "none",
        f"max(trainer_global_step{{{JOB}}})", legend="step"))
    d = d.with_panel(single(
        ids, "Straggler ratio", "Slowest task's compute time per step / the median task's. 1.0 is "
        "balanced; above 1.5 one task holds everyone back (the others wait for it in all-reduce): "
        "find it in 'Compute time vs. median' and check its host.",
        "x", "cluster:trainer_compute_duration_seconds:straggler_ratio1m", legend="cluster",
        limits=(GREEN, (1.2, "yellow"), (1.5, "red"))))
    d = d.with_panel(single(
        ids, "All-reduce bus bandwidth", "Best task's all-reduce bus bandwidth (nccl-tests busbw = "
        "algbw x 2(n-1)/n): comparable with the link's own speed. Far below `make bench-comm` "
        "means all-reduce waits for a straggler or is badly packed.",
        "Bps", "cluster:trainer_allreduce_busbw_bytes_per_second:max1m", legend="cluster"))
    d = d.with_panel(single(
        ids, "Firing alerts", "Alerts firing now (TrainerDown, TrainingStalled, Straggler, InputBound, "
        "CommunicationBound, LossNotFinite). Anything above 0: read the table at the bottom.",
        "none", 'count(ALERTS{alertstate="firing"}) or vector(0)', legend="firing",
        limits=(GREEN, (1, "red"))))

    d = d.with_panel(graph(
        ids, "Throughput", "Examples per second: the cluster total and each task's share. Tasks should "
        "be equal (each processes its own shard of the global batch); a lower task has a smaller "
        "batch or restarted.",
        "suffix: ex/s",
        [(f"sum by (job) ({EXAMPLES_RATE})", "cluster"),
         (f"sum by (job, instance, task_type, task_index) ({EXAMPLES_RATE})", TASK_LEGEND)]))
    d = d.with_panel(graph(
        ids, "Loss", "Training loss reported by each task. It should fall; flat from the start means "
        "the learning rate is too low or the data is not learnable, NaN/Inf fires LossNotFinite.",
        "none", [(f"trainer_loss{{{JOB}}} and on (job, instance) (trainer_steps_total{{{JOB}}} > 0)",
                  TASK_LEGEND)], min_zero=False))
    d = d.with_panel(graph(
        ids, "Step time p50 / p95 per task", "Wall time of a whole step per task, median and 95th "
        "percentile. All tasks show nearly the same time in synchronous training; a wide p95 "
        "against p50 means jitter (a noisy neighbour, garbage collection, checkpointing).",
        "s",
        [(step_quantile(0.5, JOB), TASK_LEGEND + " p50"), (step_quantile(0.95, JOB), TASK_LEGEND + " p95")]))
    d = d.with_panel(graph(
        ids, "Steps per second", "Synchronous steps per second. A drop to 0 while tasks are up is a stall.",
        "suffix: steps/s",
        [(f"max by (job) (rate(trainer_steps_total{{{JOB}}}[$__rate_interval]))", "cluster")]))

    d = d.with_row(row(ids, "Where step time goes"))
    d = d.with_panel(graph(
        ids, "Step breakdown: $task", "Mean seconds per step on this task, stacked: compute (forward and "
        "backward), all-reduce (gradient exchange, including waiting for the slowest task), input "
        "wait, and other (dispatch overhead the parts do not cover). The largest band is the "
        "bottleneck; 'other' above a few ms means the step is too small to be worth distributing.",
        "s",
        [('task:trainer_compute_duration_seconds:mean1m{instance=~"$task"}', TASK_LEGEND + " compute"),
         ('task:trainer_allreduce_duration_seconds:mean1m{instance=~"$task"}', TASK_LEGEND + " all-reduce"),
         ('task:trainer_input_wait_seconds:mean1m{instance=~"$task"}', TASK_LEGEND + " input wait"),
         ('task:trainer_step_other_seconds:mean1m{instance=~"$task"}', TASK_LEGEND + " other")],
        w=24, stacked=True).repeat("task").repeat_direction("h").max_per_row(4))
    d = d.with_panel(graph(
        ids, "All-reduce share of step time", "Fraction of each task's step spent in the gradient "
        "all-reduce. Above 50% (dashed line) on every task: communication-bound, use a larger "
        "per-replica batch, gradient packing or a faster network. High on all but one task: that "
        "one is a straggler.",
        "percentunit", [("task:trainer_allreduce_duration_seconds:share1m", TASK_LEGEND)],
        w=8, limits=(GREEN, (0.5, "red"))))
    d = d.with_panel(graph(
        ids, "Input-wait share of step time", "Fraction of each task's step spent waiting for the next "
        "batch. Above 20% (dashed line): input-bound, add prefetch, parallel map/interleave, "
        "caching, or more files for FILE sharding.",
        "percentunit", [("task:trainer_input_wait_seconds:share1m", TASK_LEGEND)],
        w=8, limits=(GREEN, (0.2, "red"))))
    d = d.with_panel(graph(
        ids, "Compute time vs. median (straggler)", "Each task's compute time per step divided by the "
        "median task's. A task above 1.5 (dashed line) is a straggler: everyone else waits for it. "
        "Check its CPU/GPU, container limits and neighbours.",
        "x", [("task:trainer_compute_duration_seconds:ratio_to_median1m", TASK_LEGEND)],
        w=8, limits=(GREEN, (1.5, "red"))))

    d = d.with_row(row(ids, "Communication"))
    d = d.with_panel(graph(
        ids, "All-reduce bandwidth per task", "Bus bandwidth (busbw) and algorithm bandwidth (algbw) "
        "of the gradient all-reduce, nccl-tests definitions. busbw near the link's speed (see `make "
        "bench-comm`) means the network is the limit; far below it on one task means it waits for "
        "others.",
        "Bps",
        [("task:trainer_allreduce_busbw_bytes_per_second:mean1m", TASK_LEGEND + " busbw"),
         ("task:trainer_allreduce_algbw_bytes_per_second:mean1m", TASK_LEGEND + " algbw")]))
    d = d.with_panel(graph(
        ids, "Network traffic per task", "Bytes per second sent and received by each task's network "
        "namespace (its container). Should be about equal across tasks for ring all-reduce; one "
        "task far higher is doing extra work (e.g. the chief writing checkpoints to a network disk).",
        "Bps",
        [("task:trainer_network_transmit_bytes:rate1m", TASK_LEGEND + " sent"),
         ("task:trainer_network_receive_bytes:rate1m", TASK_LEGEND + " received")]))

    d = d.with_row(row(ids, "Tasks"))
    d = d.with_panel(labels_table(
        ids, "Build info per task", "Versions and configuration of every task. All rows must agree "
        "(TensorFlow, trainer version, strategy, communication, model task); a differing row "
        "means a stale image: rebuild and restart the cluster.",
        f"last_over_time(trainer_build_info{{{JOB}}}[$__range])", hide=("instance",), w=16))
    d = d.with_panel(labels_table(
        ids, "Task state", "Last known state of every task in the time range (starting, "
        "waiting_for_peers, training, checkpointing, done, failed). A task stuck in waiting_for_peers "
        "cannot reach a peer: see its log for the missing address.",
        f"last_over_time(trainer_state{{{JOB}}}[$__range]) == 1", hide=("instance",), w=8))
    d = d.with_panel(labels_table(
        ids, "Firing alerts", "Alerts firing now, with the task they name. Empty is good. The alert "
        "descriptions in Prometheus (/alerts) say what to do.",
        'ALERTS{alertstate="firing"}', hide=("alertstate",), w=24, h=6))
    return d
