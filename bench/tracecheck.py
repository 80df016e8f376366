"""Check the marks against TensorFlow's profiler: the breakdown verified by something other than itself.

Per step, from the trace alone (the marks only split the trace into steps, at each step's t0):
compute = from the first op to the end of the last op, without the collectives' span;
all-reduce = from the first collective's start to the last collective's end. Summed over the traced
steps and compared with the marks' compute and all-reduce. An update running after t3 (the marks
missing it) makes the trace's compute longer than the marks', but only by its share of the step
(measured: ~4% on `cnn`), within the 10% tolerance: tests/unit/test_step_graph.py is what catches
that. Serial mode only: with overlap the marks measure the exposed part, the trace the whole span.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

import numpy as np

from trainer.host import trace

# Not compute: the marks, the all-reduce's own ops, the input pipeline, the loop's bookkeeping after t3.
# The op classes are trainer/observe/trace.py's, which the SCRIPT= sampler uses too.
NOT_COMPUTE = (
    *trace.MARKS,
    "CollectiveReduceV2",
    "ConcatV2",
    "SplitV",
    *trace.INPUT,
    "Pack",
    "TensorListSetItem",
    "TensorListStack",
    "TensorListConcatV2",
    "Identity",
    "Less",
)
LAUNCH = trace.LAUNCH


@dataclass(frozen=True)
class Spans:
    compute: float
    allreduce: float


def trace_events(logdir: str) -> list[tuple[float, float, str]]:
    """(start s, end s, kind) of every op the executor ran (kind = op type) and every collective launch."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))
    if not paths:
        raise FileNotFoundError(f"no xplane.pb under {logdir}")
    space = xplane_pb2.XSpace()
    with open(paths[-1], "rb") as f:
        space.ParseFromString(f.read())
    base = _session_start(space)
    events = []
    for plane in space.planes:
        for line in plane.lines:
            for e in line.events:
                name = plane.event_metadata[e.metadata_id].name
                if name == LAUNCH or (":" in name and "::" not in name):  # "op_name:OpType": an op
                    start = base + line.timestamp_ns * 1e-9 + e.offset_ps * 1e-12
                    kind = name if name == LAUNCH else name.rsplit(":", 1)[1]
                    events.append((start, start + e.duration_ps * 1e-12, kind))
    return sorted(events)


def _session_start(space) -> float:
    """Unix seconds of the profiling session's start: TF 2.21 stores event times relative to it (seen:
    a 48 ms trace at 0.001..0.049 s for marks at 1796126149.7 s), and the start as `profile_start_time`
    on its "Task Environment" plane. 0 when absent (older TF kept absolute times)."""
    for plane in space.planes:
        for stat in plane.stats:
            if plane.stat_metadata[stat.metadata_id].name == "profile_start_time":
                return (stat.uint64_value or stat.int64_value) * 1e-9
    return 0.0


def from_trace(events, marks: np.ndarray) -> tuple[Spans, np.ndarray, float]:
    """Summed trace spans of the steps (rows t_start, t0, t1, t2, t3) the trace holds, those rows, and
    the trace clock's offset.
    A step is held when at least one of its marks lies in a traced Timestamp op: that pins the clocks'
    offset for it. After a function has run many times the executor deems the Timestamp ops cheap and
    TensorFlow 2.21 traces most of them no more, even at host_tracer_level 3 (seen: 1 of the 5 per
    step after 200 settling steps, "the trace holds none of the 20 steps' marks" when all 5 were
    required; none at all in CI, then the clocks themselves line up: _same_clock); the ops that take
    the step's time (convolutions, the collective) stay traced."""
    ops = sorted((e[0], e[1]) for e in events if e[2] == "Timestamp")
    if not events:
        raise ValueError("the trace holds no op events")
    if ops:
        stamps = np.array(ops)  # (start, end) of every Timestamp op, by start
        offset = _offset(stamps, marks.ravel())
        held = np.array([any(_near(stamps, m + offset) for m in row) for row in marks])
    else:
        offset, held = _same_clock(events, marks)
    bounds = [*(marks[:, 1] + offset), float("inf")]
    total = Spans(0.0, 0.0)
    for i in np.flatnonzero(held):
        one = _step(events, bounds[i], bounds[i + 1])
        total = Spans(total.compute + one.compute, total.allreduce + one.allreduce)
    return total, marks[held], offset


def _same_clock(events, marks: np.ndarray) -> tuple[float, np.ndarray]:
    """No Timestamp op traced at all (TF 2.21 at host_tracer_level 3 after a function ran a few hundred
    times, seen for mlp and in CI for cnn): line the marks up on the clock itself. The Timestamp op
    reads Env::NowMicros and the host tracer EnvTime::NowNanos, both CLOCK_REALTIME, and trace_events
    adds back the session start the XPlane's times are relative to (the offset found from traced ops,
    when there are some, is `offset_us` in tracecheck-json). A step is held when an op event starts
    between its t0 and t3."""
    starts = np.array([e[0] for e in events])
    return 0.0, np.array([bool(np.any((starts >= row[1]) & (starts <= row[4]))) for row in marks])


MATCH_S = 20e-6
"""Slack around a Timestamp op's traced span for the value it returned (two clocks read ~1 us apart).
The value is read while the op runs, so it lies inside the op's span however long a loaded machine
stretches it: a fixed distance from the op's start (the former test) failed under load, when a
preempted op's clock read came >20 us after its start ("the trace holds none of the 20 steps' marks")."""


def _near(spans: np.ndarray, x: float) -> bool:
    """Whether x lies within a Timestamp op's (start, end), give or take MATCH_S."""
    i = int(np.searchsorted(spans[:, 0], x + MATCH_S, side="right"))
    return any(spans[j, 1] + MATCH_S >= x for j in range(max(0, i - 3), i))


def _offset(spans: np.ndarray, flat: np.ndarray) -> float:
    """Trace clock minus Unix clock: the shift that puts the most marks inside Timestamp ops, among the
    shifts that put some mark at an end of one of the first ops, and none (both clocks are Unix time
    when the profiler does not rebase its own)."""
    shifts = [0.0, *(edge - m for edge in spans[:5].ravel() for m in flat)]
    return max(shifts, key=lambda o: sum(_near(spans, m + o) for m in flat))


def _step(events, begin: float, end: float) -> Spans:
    inside = [e for e in events if begin <= e[0] < end]
    ops = [e for e in inside if e[2] not in NOT_COMPUTE and e[2] != LAUNCH]
    launches = [e[0] for e in inside if e[2] == LAUNCH]
    if not launches:
        return Spans(max(e[1] for e in ops) - min(e[0] for e in ops), 0.0)
    launch, done = min(launches), max(e[1] for e in inside if e[2] == "CollectiveReduceV2")
    # The all-reduce also packs (concat) before and unpacks (split) after its collectives. It ends with
    # its last unpack, not with the collective's event: that async kernel's event closes after its done
    # callback, which can run the unpack and the t2 mark first (a loaded trial: the event closed 2.2 ms
    # after its split had ended, in 6 of 40 steps; the trace's all-reduce was 12.5 % over the marks').
    packs = [e[0] for e in inside if e[2] == "ConcatV2" and e[1] <= launch]
    unpacks = [e[1] for e in inside if e[2] == "SplitV" and e[0] >= launch]
    first, last = max(packs, default=launch), max(unpacks, default=done)
    work = [*ops, (first, last, "")]
    return Spans(max(e[1] for e in work) - min(e[0] for e in work) - (last - first), last - first)


def from_marks(marks: np.ndarray) -> Spans:
    t0, t1, t2, t3 = marks[:, 1], marks[:, 2], marks[:, 3], marks[:, 4]
    return Spans(compute=float(np.sum(t1 - t0 + t3 - t2)), allreduce=float(np.sum(t2 - t1)))


# The profiler's host level that records every op. At the default (2) an op is recorded only while the
# executor deems it expensive: every op starts so (an estimate of 1e8 cycles) and the estimate decays by
# a tenth per run (KernelStats in TF's executor.cc), so after ~90 runs of a node a cheap op such as the
# Timestamp marks drops out of the trace. A fresh function still shows them; the bench's, after
# thousands of steps, did not ("the trace holds no timestamps").
HOST_TRACER_LEVEL = 3
SETTLE_STEPS = 200
"""Steps run before the traced call by `main`: past the ~90 runs after which the executor reclassifies
cheap ops, as the bench's functions are by the time it traces them."""


def traced_call(fns, iterator, steps: int, logdir: str, profile: bool) -> np.ndarray:
    """One timed call of `steps` steps, under the profiler when `profile`: its marks."""
    import tensorflow as tf

    if profile:
        tf.profiler.experimental.start(
            logdir, options=tf.profiler.experimental.ProfilerOptions(host_tracer_level=HOST_TRACER_LEVEL)
        )
    try:
        marks = fns.timed(iterator, steps)[0].numpy()
    finally:
        if profile:
            tf.profiler.experimental.stop()
    return marks


def check(fns, iterator, steps: int, chief: bool) -> tuple[Spans, Spans, int, float] | None:
    """Trace one timed call of `steps` steps on the chief and compare (None on the other tasks, which
    run the same call so that its collectives complete): what `make bench` (c) and `main` both run."""
    import tempfile

    with tempfile.TemporaryDirectory() as logdir:
        marks = traced_call(fns, iterator, steps, logdir, profile=chief)
        return compare(marks, logdir) if chief else None


def compare(marks: np.ndarray, logdir: str) -> tuple[Spans, Spans, int, float]:
    """(from the marks, from the trace, steps compared, trace clock offset): over the steps the trace holds."""
    events = trace_events(logdir)
    theirs, held, offset = from_trace(events, marks)
    if not held.size:
        stamps = sum(e[2] == "Timestamp" for e in events)
        raise ValueError(
            f"the trace ({len(events)} op events, {stamps} Timestamp, {events[0][0]:.6f}..{events[-1][1]:.6f} s)"
            f" holds none of the {len(marks)} steps' marks ({marks.min():.6f}..{marks.max():.6f} s)"
        )
    return from_marks(held), theirs, len(held), offset


def deviation(ours: float, theirs: float) -> float:
    return abs(ours - theirs) / theirs if theirs else float("inf")


def describe(ours: Spans, theirs: Spans, steps: int) -> str:
    return (
        f"compute marks {1000 * ours.compute / steps:.2f} ms vs trace {1000 * theirs.compute / steps:.2f} ms "
        f"({deviation(ours.compute, theirs.compute):.1%}), all-reduce marks {1000 * ours.allreduce / steps:.2f} ms "
        f"vs trace {1000 * theirs.allreduce / steps:.2f} ms ({deviation(ours.allreduce, theirs.allreduce):.1%})"
    )


def main(argv=None) -> int:
    """In every task of a local cluster; the chief traces one timed call and prints the comparison.

    python -m bench.launch --workers 1 --metrics-port 0 --module bench.tracecheck --task cnn
    """
    import argparse
    import json

    import trainer  # noqa: F401 (tf-keras before TensorFlow)
    from trainer.host import config as config_lib
    from trainer.host import parse_tf_config, step, tasks, training

    p = argparse.ArgumentParser(prog="python -m bench.tracecheck")
    p.add_argument("--trace-steps", type=int, default=20)
    p.add_argument("--settle-steps", type=int, default=SETTLE_STEPS)
    args, rest = p.parse_known_args(argv)
    config = config_lib.from_args(rest, os.environ)
    spec = parse_tf_config(os.environ.get("TF_CONFIG"))
    strategy = training.make_strategy(config, spec)
    with strategy.scope():
        task = tasks.from_config(config)
        optimizer = step.optimizer(config, strategy.num_replicas_in_sync)
    fns = step.build(
        strategy,
        task,
        optimizer,
        config.per_replica_batch * strategy.num_replicas_in_sync,
        step.StepOptions.of(config),
    )
    iterator = iter(strategy.distribute_datasets_from_function(task.dataset_fn))
    fns.timed(iterator, args.trace_steps)[1].numpy()  # trace the function
    for _ in range(max(1, args.settle_steps // args.trace_steps)):  # settle, as the bench's have
        fns.timed(iterator, args.trace_steps)[1].numpy()
    chief = spec is None or spec.is_chief
    found = check(fns, iterator, args.trace_steps, chief)
    if chief:
        ours, theirs, steps, offset = found
        print(
            f"tracecheck: {steps} of {args.trace_steps} steps in the trace:",
            describe(ours, theirs, steps),
            flush=True,
        )
        print(
            "tracecheck-json:",
            json.dumps(
                {"marks": ours.__dict__, "trace": theirs.__dict__, "steps": steps, "offset_us": 1e6 * offset}
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
