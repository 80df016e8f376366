"""The split of every step of a user's script, from marks put into its own graph while it traces.

MWMS sends every dense all-reduce through CollectiveReplicaLauncher.all_reduce (batched packs
too), and every `next(iterator)` of a distributed dataset through DistributedIteratorBase.get_next;
both build ops into the step function as it is traced. Wrapped, each adds two Timestamp ops around
what it builds (the first a control input of it, the second after its outputs), and a stateful
numpy_function that hands the pair to a Marks sink on the host: the all-reduce's span (waiting for
the slowest task included, as the built-in trainer's t1..t2) and the time the step waited for its
batch. The hooks clear the sink when a call of the step function starts and read it when the call
returns (Recorder.call): compute is the rest of the call's host time. Every step is measured, not
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
    """What the graph's numpy_functions hand over (from TensorFlow's executor threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[str, list[tuple[float, float]]] = {ALLREDUCE: [], INPUT: []}
        self.seen = False
        """Whether any step function carried all-reduce marks: only then is the split measured."""
        self.batches = 0
        """Batches the running call has taken so far (its input marks): handed over as each batch
        arrives, while the call still runs, so a task blocked in its input is seen behind its peers
        (trainer_input_step, trainer/supervise.py) even when every task is frozen in the collective."""

    def add(self, kind: str, start, stop) -> None:
        with self._lock:
            self._spans[kind].append((float(start), float(stop)))
            self.seen = self.seen or kind == ALLREDUCE
            self.batches += kind == INPUT

    def clear(self) -> None:
        with self._lock:
            for spans in self._spans.values():
                spans.clear()
            self.batches = 0

    def take(self) -> dict[str, float] | None:
        """Seconds of all-reduce and of input wait since clear(); None when no all-reduce was marked."""
        with self._lock:
            spans = {kind: list(s) for kind, s in self._spans.items()}
        self.clear()
        if not spans[ALLREDUCE]:
            return None
        return {kind: union_seconds(s) for kind, s in spans.items()}


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
