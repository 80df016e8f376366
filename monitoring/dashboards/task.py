"""Task detail: one task's state, step time and its parts, bandwidth and traffic."""

import itertools

from grafana_foundation_sdk.models import common

from .panels import (GREEN, TASK_LEGEND, graph, labels_table, new_dashboard, row, single, step_quantile,
                     task_variable)

UID = "trainer-task"
SEL = 'job="trainer", instance="$task"'


def mean(part: str) -> str:
    """Mean seconds per step of one histogram, over Grafana's rate interval."""
    return (f"sum by (job, instance, task_type, task_index) (rate({part}_sum{{{SEL}}}[$__rate_interval])) / "
            f"sum by (job, instance, task_type, task_index) (rate({part}_count{{{SEL}}}[$__rate_interval]))")


def build():
    ids = itertools.count(1)
    d = new_dashboard(
        UID, "Task detail",
        "One trainer task (chief or worker) in detail: pick it with the Task variable.",
    ).with_variable(task_variable(multi=False))

    d = d.with_row(row(ids, "$task"))
    d = d.with_panel(single(
        ids, "State", "The task's state. training is normal; waiting_for_peers for long means a peer "
        "is unreachable (its log names it); failed: read this task's log.",
        "none", f"trainer_state{{{SEL}}} == 1", legend="{{trainer_state}}",
        text_mode=common.BigValueTextMode.NAME))
    d = d.with_panel(single(
        ids, "Global step", "Steps this task has completed (continues from the checkpoint after a "
        "restart).", "none", f"trainer_global_step{{{SEL}}}"))
    d = d.with_panel(single(
        ids, "Time since last step", "Seconds since this task finished a step. Over 2 minutes while not "
        "done fires TrainingStalled: a peer died or hangs in a collective.",
        "s", f"task:trainer_last_step:age_seconds{{{SEL}}}", limits=(GREEN, (30, "yellow"), (120, "red"))))
    d = d.with_panel(single(
        ids, "Last checkpoint step", "Step of the last checkpoint: a restart resumes here and loses the "
        "steps after it. Far behind the global step: lower --save-every.",
        "none", f"trainer_last_checkpoint_step{{{SEL}}}"))
    d = d.with_panel(single(
        ids, "World size", "Number of tasks taking part in the all-reduce. Must equal chief + workers.",
        "none", f"trainer_world_size{{{SEL}}}"))
    d = d.with_panel(single(
        ids, "Examples per second", "This task's examples per second (1 min rate).",
        "suffix: ex/s", f"task:trainer_examples:rate1m{{{SEL}}}"))

    d = d.with_panel(graph(
        ids, "Step time quantiles", "Wall time of a whole step: median, 95th and 99th percentile. A "
        "p99 far above p50 means occasional long steps (checkpoints, GC, a noisy neighbour).",
        "s", [(step_quantile(q, SEL), f"p{round(q * 100)}") for q in (0.5, 0.95, 0.99)]))
    d = d.with_panel(graph(
        ids, "Step breakdown", "Mean seconds per step, stacked: compute, all-reduce (includes waiting "
        "for the slowest task), input wait and other (dispatch overhead the parts do not cover), so "
        "the top of the stack is the whole step. The largest band is this task's bottleneck.",
        "s",
        [(mean("trainer_compute_duration_seconds"), "compute"),
         (mean("trainer_allreduce_duration_seconds"), "all-reduce"),
         (mean("trainer_input_wait_seconds"), "input wait"),
         (f"{mean('trainer_step_duration_seconds')} - {mean('trainer_compute_duration_seconds')} - "
          f"{mean('trainer_allreduce_duration_seconds')} - {mean('trainer_input_wait_seconds')}", "other")],
        stacked=True))
    d = d.with_panel(graph(
        ids, "Share of step time", "Fraction of the step in all-reduce (communication-bound above 50%) "
        "and in input wait (input-bound above 20%).",
        "percentunit",
        [(f"task:trainer_allreduce_duration_seconds:share1m{{{SEL}}}", "all-reduce"),
         (f"task:trainer_input_wait_seconds:share1m{{{SEL}}}", "input wait"),
         (f"task:trainer_compute_duration_seconds:share1m{{{SEL}}}", "compute")],
        limits=(GREEN, (0.2, "yellow"), (0.5, "red"))))
    d = d.with_panel(graph(
        ids, "Loss", "This task's training loss. It should fall; NaN or Inf fires LossNotFinite.",
        "none", [(f"trainer_loss{{{SEL}}} and on (job, instance) (trainer_steps_total{{{SEL}}} > 0)",
                  TASK_LEGEND)], min_zero=False))
    d = d.with_panel(graph(
        ids, "All-reduce bandwidth", "Algorithm and bus bandwidth of this task's gradient all-reduce "
        "(nccl-tests definitions). Lower than on the other tasks: this task waits for a straggler.",
        "Bps",
        [(f"task:trainer_allreduce_busbw_bytes_per_second:mean1m{{{SEL}}}", "busbw"),
         (f"task:trainer_allreduce_algbw_bytes_per_second:mean1m{{{SEL}}}", "algbw")]))
    d = d.with_panel(graph(
        ids, "Network traffic", "Bytes per second sent and received by this task's container.",
        "Bps",
        [(f"task:trainer_network_transmit_bytes:rate1m{{{SEL}}}", "sent"),
         (f"task:trainer_network_receive_bytes:rate1m{{{SEL}}}", "received")]))
    d = d.with_panel(labels_table(
        ids, "Build info", "This task's versions and configuration; must match every other task's "
        "(see Training overview).", f"last_over_time(trainer_build_info{{{SEL}}}[$__range])", w=24, h=4))
    return d
