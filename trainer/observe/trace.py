"""Where a traced call's time went, from TensorFlow's profiler op events alone.

The op classification bench/tracecheck.py also uses (one list): collectives are all-reduce, the
iterator's GetNext ops are input wait, everything else the function ran is compute. A call is one
execution of the step function, found in the trace by its `EagerLocalExecute: __inference_<name>_<id>` event, so no
clock has to be lined up with the host's. Per call: all-reduce = the union of the collective ops'
intervals, each widened by the executor's scheduling around it (with_scheduling), input = the union of the GetNext intervals outside them, compute = the rest of the
function's span (gaps between ops inside the graph included, as tracecheck counts them).
"""

from __future__ import annotations

import bisect
import glob
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

COLLECTIVES = (
    "CollectiveReduceV2",
    "CollectiveGatherV2",
    "CollectiveBcastSendV2",
    "CollectiveBcastRecvV2",
    "CollectiveAllToAllV2",
    "NcclAllReduce",
)
"""Ops that wait for the other tasks: their time is all-reduce (waiting for the slowest included)."""
INPUT = (
    "IteratorGetNext",
    "IteratorGetNextAsOptional",
    "MultiDeviceIteratorGetNextFromShard",
)
"""Ops that hand the step its next batch: their time outside the collectives is input wait."""
INPUT_WORK = {
    "IteratorGetNextOp::DoCompute": "IteratorGetNext",
    "IteratorGetNextAsOptionalOp::DoCompute": "IteratorGetNextAsOptional",
}
"""The iterator ops are async kernels: their op event marks the kernel starting, and the wait for
the batch is this event on the iterator's thread (TF 2.21). Read as the op it belongs to."""
LAUNCH = "CollectiveOpV2Kernel::Run"  # the collective kernel starting, before its async part
MARKS = ("Timestamp",)
"""The built-in trainer's marks (tf.timestamp): neither compute nor anything else."""

Interval = tuple[float, float]
Event = tuple[float, float, str]
"""(start s, end s, kind): kind is the op type, LAUNCH, or `call:<name>` for a function call."""


@dataclass(frozen=True)
class Parts:
    """Seconds of one or more calls spent in each part; `span` is the functions' own wall time."""

    span: float = 0.0
    compute: float = 0.0
    allreduce: float = 0.0
    input: float = 0.0
    calls: int = 0

    def __add__(self, other: Parts) -> Parts:
        return Parts(*(a + b for a, b in zip(self.astuple(), other.astuple(), strict=True)))

    def astuple(self) -> tuple[float, float, float, float, int]:
        return (self.span, self.compute, self.allreduce, self.input, self.calls)


def xspace_events(path: str, functions: Sequence[str] = ()) -> list[Event]:
    """Op events (kind = op type), collective launches and calls of the named functions in one xplane.pb."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    prefixes = tuple(f"__inference_{name}_" for name in functions)
    events = []
    for plane in space.planes:
        names = {k: m.name for k, m in plane.event_metadata.items()}
        for line in plane.lines:
            base = line.timestamp_ns * 1e-9
            for e in line.events:
                kind = _kind(names[e.metadata_id], prefixes)
                if kind:
                    start = base + e.offset_ps * 1e-12
                    events.append((start, start + e.duration_ps * 1e-12, kind))
    return sorted(events)


def _kind(name: str, prefixes: tuple[str, ...]) -> str | None:
    if name == LAUNCH:
        return name
    if (work := INPUT_WORK.get(name.split("#", 1)[0])) is not None:  # TraceMeEncode may append #args#
        return work
    if ": " in name:  # "EagerLocalExecute: __inference_train_step_13": a function call, not an op
        executed = name.rpartition(": ")[2]
        return "call:" + executed if prefixes and executed.startswith(prefixes) else None
    if ":" in name and "::" not in name:  # "op_name:OpType": an op the executor ran
        return name.rsplit(":", 1)[1]
    return None


def latest_xplane(logdir: str) -> str:
    paths = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))
    if not paths:
        raise FileNotFoundError(f"no xplane.pb under {logdir}")
    return paths[-1]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def clip(intervals: Iterable[Interval], begin: float, end: float) -> list[Interval]:
    return [(max(a, begin), min(b, end)) for a, b in intervals if b > begin and a < end]


def minus(intervals: Sequence[Interval], holes: Sequence[Interval]) -> list[Interval]:
    """`intervals` without what `holes` covers (both sorted and disjoint)."""
    out = []
    for a, b in intervals:
        for h0, h1 in holes:
            if h1 <= a or h0 >= b:
                continue
            if h0 > a:
                out.append((a, h0))
            a = max(a, h1)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out


def calls(events: Sequence[Event]) -> list[Interval]:
    """The step function's calls the trace holds whole (nested duplicates of one call merged)."""
    return union((s, e) for s, e, kind in events if kind.startswith("call:"))


NOT_NEIGHBOURS = (*COLLECTIVES, *MARKS, LAUNCH, "PyFunc")
"""Ops that do not bound a collective's wait: other collectives, marks and their hand-over."""


def with_scheduling(events: Sequence[Event], begin: float, end: float) -> list[Interval]:
    """Each collective of the call (begin, end) from the end of the call's last op that ended before
    it (its input is ready by then) to the start of the first that started after it: the executor's
    scheduling around the collective is time the step waits for it too, as the marks' t1..t2 count
    it. A lower bound: an unrelated op nearer in time shortens it, nothing lengthens it."""
    inside = [(s, e, k) for s, e, k in events if begin <= s and e <= end and not k.startswith("call:")]
    others = [(s, e) for s, e, k in inside if k not in NOT_NEIGHBOURS]
    starts, ends = sorted(s for s, _ in others), sorted(e for _, e in others)
    out = []
    for s, e, k in inside:
        if k in COLLECTIVES:
            i, j = bisect.bisect_right(ends, s), bisect.bisect_left(starts, e)
            out.append((ends[i - 1] if i else s, starts[j] if j < len(starts) else e))
    return out


def split(events: Sequence[Event]) -> Parts:
    """Summed parts of every call the trace holds whole."""
    inputs = union((s, e) for s, e, k in events if k in INPUT)
    total = Parts()
    for begin, end in calls(events):
        reduce_ = union(with_scheduling(events, begin, end))
        wait = minus(clip(inputs, begin, end), reduce_)
        a, i = length(reduce_), length(wait)
        total += Parts(span=end - begin, compute=end - begin - a - i, allreduce=a, input=i, calls=1)
    return total
