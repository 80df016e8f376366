"""The split of every step of a user's script, from marks put into its own graph while it traces.

MWMS sends every dense all-reduce through CollectiveReplicaLauncher.all_reduce (batched packs
too), and every `next(iterator)` of a distributed dataset through DistributedIteratorBase.get_next;
both build ops into the step function as it is traced. Wrapped, each adds two Timestamp ops around
what it builds (the first a control input of it, the second after its outputs): the all-reduce's
span (waiting for the slowest task included, as the built-in trainer's t1..t2) and the time the step
waited for its batch. An all-reduce's span is added by the graph to a variable (_Sums: seconds and count)
that the host reads when a call starts and when it returns; a batch's pair is handed to the host by
a stateful numpy_function as the batch arrives (the input step a stuck task is seen at). The hooks mark when a call of the
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

import numpy as np

ALLREDUCE, INPUT = "allreduce", "input"
_ALL_REDUCE_ARGS = ("self", "input_tensor", "control_input", "options")
_GET_NEXT_ARGS = ("self", "name")


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by the spans, overlaps counted once (packs all-reduced concurrently)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


class Marks:
    """What the graph's marks hand over: spans from TensorFlow's executor threads (batches), sums in
    a variable (all-reduces)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[str, list[tuple[float, float]]] = {ALLREDUCE: [], INPUT: []}
        self._sums: _Sums | None = None
        self._base = (0.0, 0.0)
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

    def sums(self) -> _Sums:
        """The all-reduce sums, created by the first all-reduce a step function builds."""
        with self._lock:
            if self._sums is None:
                self._sums = _Sums()
            return self._sums

    def clear(self) -> None:
        """A call starts: what was marked before now (another function's all-reduces, an evaluate,
        the tracing call) is not its own."""
        self._reset(self._read())

    def _read(self) -> tuple[float, float]:
        return self._sums.read() if self._sums is not None else (0.0, 0.0)

    def _reset(self, base: tuple[float, float]) -> None:
        with self._lock:
            for spans in self._spans.values():
                spans.clear()
            self.batches = 0
            self._base = base

    def take(self) -> dict[str, float] | None:
        """Seconds of all-reduce and of input wait since clear(); None when no all-reduce was marked."""
        now = self._read()
        with self._lock:
            spans, base = {kind: list(s) for kind, s in self._spans.items()}, self._base
        self._reset(now)  # read once: nothing is counted twice
        if now[1] - base[1] <= 0 and not spans[ALLREDUCE]:
            return None
        self.seen = True
        allreduce = now[0] - base[0] + union_seconds(spans[ALLREDUCE])  # the graph's, the host's
        return {ALLREDUCE: allreduce, INPUT: union_seconds(spans[INPUT])}


class _Sums:
    """All-reduce seconds and count, summed by the graph into one variable the host reads at a call's
    start and end. Not a numpy_function per all-reduce (a Python call under the GIL in the middle of
    the step, ~46 us of CPU each, 7 per step in the fit seed script), nor a ring of rows (a counter,
    an index and a scatter: four ops more per all-reduce, run in every step): a subtraction and an
    add. The sum is the union of the spans: they never overlap, because the marks' Timestamp ops are
    stateful without a resource, and automatic control dependencies run all such ops in program
    order (each all-reduce's start mark after the previous one's end mark)."""

    def __init__(self) -> None:
        import tensorflow as tf
        from tensorflow.python.ops import resource_variable_ops

        # Built while a step function traces: lifted out of it, and a plain variable rather than
        # whatever the strategy's scope would make of tf.Variable (a mirrored one, with a broadcast).
        with tf.init_scope():
            self.sums = resource_variable_ops.ResourceVariable(
                tf.zeros((2,), tf.float64), trainable=False, name="observe_marks_allreduce"
            )

    def write(self, start, stop) -> None:
        """In the graph: the span's seconds and 1 added to the sums."""
        import tensorflow as tf

        with tf.device(self.sums.device):  # beside the variable (a step built under a GPU's scope)
            self.sums.assign_add(tf.stack([stop - start, tf.constant(1.0, tf.float64)]))

    def read(self) -> tuple[float, float]:
        """On the host, between calls: (seconds, count) so far."""
        import tensorflow as tf

        with tf.init_scope():
            seconds, count = self.sums.numpy()
        return float(seconds), float(count)


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
        marks.sums().write(start, stop)
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
