"""The split of every step of a user's script, from marks put into its own graph while it traces.

MWMS sends every dense all-reduce through CollectiveReplicaLauncher.all_reduce (batched packs
too), and every `next(iterator)` of a distributed dataset through DistributedIteratorBase.get_next;
both build ops into the step function as it is traced. Wrapped, each adds two Timestamp ops around
what it builds (the first a control input of it, the second after its outputs): the all-reduce's
span (waiting for the slowest task included, as the built-in trainer's t1..t2) and the time the step
waited for its batch. An all-reduce's pair goes into a ring of two variables the graph writes (_Ring)
and the host reads once per call; a batch's pair is handed to the host by a stateful numpy_function
as the batch arrives (the input step a stuck task is seen at). The hooks mark when a call of the
step function starts and read the marks when it returns (Recorder.call): compute is the rest of the
call's host time. Every step is measured, not
sampled, and no profiler runs.

Not marked (the sampled split, sampler.py, remains for them when turned on): steps compiled with
XLA (`jit_compile=True`: no Timestamp kernel there), eager all-reduces, and a batch fetched eagerly
outside the step function (its wait is not part of the call's host time either). Both wrapped
methods are private API: `install` checks they exist with the arguments used here, so a TensorFlow
that changed them fails loudly at start-up instead of observing nothing.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time

import numpy as np

ALLREDUCE, INPUT = "allreduce", "input"
_ALL_REDUCE_ARGS = ("self", "input_tensor", "control_input", "options")
_GET_NEXT_ARGS = ("self", "name")
RING_ROWS = 1 << 16
"""All-reduce spans the ring holds between two reads: a call's own are its steps times the packs
per step (70 for the fit seed script at steps_per_execution=10); 1 MiB of float64 pairs."""


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by the spans, overlaps counted once (packs all-reduced concurrently)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


class Marks:
    """What the graph's numpy_functions hand over (from TensorFlow's executor threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[str, list[tuple[float, float]]] = {ALLREDUCE: [], INPUT: []}
        self._ring: _Ring | None = None
        self._since = 0.0
        self.seen = False
        """Whether any step function carried all-reduce marks: only then is the split measured."""
        self.batches = 0
        """Batches the running call has taken so far (its input marks): handed over as each batch
        arrives, while the call still runs, so a task blocked in its input is seen behind its peers
        (trainer_input_step, trainer/supervise.py) even when every task is frozen in the collective."""

    def add(self, kind: str, start, stop) -> None:
        with self._lock:
            self._spans[kind].append((float(start), float(stop)))
            self.batches += kind == INPUT

    def ring(self) -> _Ring:
        """The all-reduce ring, created by the first all-reduce a step function builds."""
        with self._lock:
            if self._ring is None:
                self._ring = _Ring()
            return self._ring

    def clear(self) -> None:
        """A call starts (or a tracing call ended): what was marked before now is not its own."""
        with self._lock:
            for spans in self._spans.values():
                spans.clear()
            self.batches = 0
            self._since = time.time()  # the ring's rows are kept; those that start earlier are skipped

    def take(self) -> dict[str, float] | None:
        """Seconds of all-reduce and of input wait since clear(); None when no all-reduce was marked."""
        with self._lock:
            spans = {kind: list(s) for kind, s in self._spans.items()}
            ring, since = self._ring, self._since
        ringed = ring.read(since) if ring is not None else []
        self.clear()
        if ringed is None:  # the call wrote more than the ring holds: its all-reduce is not known
            return None
        spans[ALLREDUCE] += ringed
        if not spans[ALLREDUCE]:
            return None
        self.seen = True
        return {kind: union_seconds(s) for kind, s in spans.items()}


class _Ring:
    """All-reduce spans that the graph writes into two variables (a counter and RING_ROWS pairs) and
    the host reads once per call. Not a numpy_function per pack: that is a Python call under the GIL
    in the middle of the step (~46 us of CPU each, measured, 7 per step in the fit seed script),
    where a counter and a scatter cost ~10 us and no GIL. Rows are read from where the last read
    stopped; the ones older than the call (another function's all-reduces, an evaluate) are skipped."""

    def __init__(self) -> None:
        import tensorflow as tf
        from tensorflow.python.ops import resource_variable_ops

        # Built while a step function traces: lifted out of it, and plain variables rather than
        # whatever the strategy's scope would make of tf.Variable (a mirrored one, with a broadcast).
        self.rows = RING_ROWS
        with tf.init_scope():
            variable = functools.partial(resource_variable_ops.ResourceVariable, trainable=False)
            self.count = variable(tf.constant(0, tf.int64), name="observe_marks_count")
            self.spans = variable(tf.zeros((self.rows, 2), tf.float64), name="observe_marks_spans")
        self._read = 0

    def write(self, start, stop) -> None:
        """In the graph: the pair into the next row (the counter's ops run in program order, as
        automatic control dependencies chain every op of one variable)."""
        import tensorflow as tf
        from tensorflow.python.ops import gen_state_ops

        with tf.device(self.spans.device):  # beside the variables (a step built under a GPU's scope)
            row = tf.math.floormod(self.count.assign_add(1) - 1, self.rows)
            pair = tf.reshape(tf.stack([start, stop]), (1, 2))
            gen_state_ops.resource_scatter_nd_update(self.spans.handle, tf.reshape(row, (1, 1)), pair)

    def read(self, since: float) -> list[tuple[float, float]] | None:
        """On the host, between calls: the rows written since the last read that start at `since` or
        later; None when rows the call wrote were overwritten (more than RING_ROWS of them)."""
        import tensorflow as tf

        with tf.init_scope():
            written = int(self.count.numpy())
            previous, self._read = self._read, written
            first = max(previous, written - self.rows)
            if written == first:
                return []
            rows = self.spans.sparse_read(tf.range(first, written, dtype=tf.int64) % self.rows).numpy()
        if first > previous and rows[0][0] >= since:  # the overwritten rows may have been the call's
            return None
        return [(float(a), float(b)) for a, b in rows if a >= since]


def _markable() -> bool:
    """Inside a graph being built, and not one XLA compiles (it has no Timestamp kernel)."""
    import tensorflow as tf
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    return tf.inside_function() and not control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph())


def _bracket(marks: Marks, kind: str, build, after):
    """Build `build()` between two Timestamp ops; `after(result)` names the tensors it waits for."""
    import tensorflow as tf

    start = tf.timestamp()
    with tf.control_dependencies([start]):
        result = build()
    with tf.control_dependencies(after(result)):
        stop = tf.timestamp()
    if kind == ALLREDUCE:
        marks.ring().write(start, stop)
        return result
    handed = tf.numpy_function(functools.partial(_hand, marks, kind), [start, stop], tf.bool, stateful=True)
    _independent(handed.op)
    return result


def _independent(op) -> None:
    """Out of the chain automatic control dependencies put every stateful op in (program order): else
    the next all-reduce's start mark waits for this hand-over (a Python call under the GIL), which put
    it between consecutive collectives (seen in the traced graph: Timestamp_4 <- PyFunc_1). It still
    runs before the function returns."""
    from tensorflow.python.framework import ops

    manager = getattr(ops.get_default_graph(), "experimental_acd_manager", None)
    if manager is not None:
        manager.run_independently(op)


def _hand(marks: Marks, kind: str, start, stop):
    marks.add(kind, start, stop)
    return np.bool_(True)


def _tensors(value) -> list:
    import tensorflow as tf

    return [t for t in tf.nest.flatten(value, expand_composites=True) if isinstance(t, tf.Tensor)]


def _check(method, expected: tuple[str, ...]) -> None:
    params = tuple(inspect.signature(method).parameters)
    if params[: len(expected)] != expected:
        raise RuntimeError(
            f"observe: TensorFlow changed {method.__qualname__}{params}; the step split needs "
            f"{expected} (trainer/observe/marks.py): pin the TensorFlow of images/requirements-*.lock"
        )


def install(marks: Marks) -> None:
    """Wrap MWMS's all-reduce launcher and the distributed iterator's get_next."""
    from tensorflow.python.distribute import cross_device_utils, input_lib

    launcher, iterator = cross_device_utils.CollectiveReplicaLauncher, input_lib.DistributedIteratorBase
    all_reduce, get_next = launcher.all_reduce, iterator.get_next
    _check(all_reduce, _ALL_REDUCE_ARGS)
    _check(get_next, _GET_NEXT_ARGS)

    @functools.wraps(all_reduce)
    def marked_all_reduce(self, input_tensor, control_input=None, options=None):
        call = functools.partial(all_reduce, self, input_tensor, control_input, options)
        if not _markable():
            return call()
        import tensorflow as tf

        with tf.control_dependencies([input_tensor]):  # the span starts when the gradients are ready
            return _bracket(marks, ALLREDUCE, call, lambda out: [out])

    @functools.wraps(get_next)
    def marked_get_next(self, name=None):
        call = functools.partial(get_next, self, name)
        return _bracket(marks, INPUT, call, _tensors) if _markable() else call()

    launcher.all_reduce = marked_all_reduce
    iterator.get_next = marked_get_next
