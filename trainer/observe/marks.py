"""The split of every step of a user's script, from marks put into its own graph while it traces.

MWMS sends every dense all-reduce through CollectiveReplicaLauncher.all_reduce (batched packs
too), and every `next(iterator)` of a distributed dataset through DistributedIteratorBase.get_next;
both build ops into the step function as it is traced. Wrapped, each adds two Timestamp ops around
what it builds (the first a control input of it, the second after its outputs): the all-reduce's
span (waiting for the slowest task included, as the built-in trainer's t1..t2) and the time the step
waited for its batch. Each span is added by the graph to its kind's slots of one variable (_Sums:
seconds and count), which the host reads when a call starts and when it returns, and the metrics
scrape reads for the batches taken so far (the input step a stuck task is seen at). The hooks mark when a call of the
step function starts and read the marks when it returns (Recorder.call): compute is the rest of the
call's host time. Every step is measured, not sampled; no profiler runs and no Python is called in
the step.

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

ALLREDUCE, INPUT = "allreduce", "input"
_ALL_REDUCE_ARGS = ("self", "input_tensor", "control_input", "options")
_GET_NEXT_ARGS = ("self", "name")


class Marks:
    """What the graph's marks hand over: each kind's seconds and count, summed in one variable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: _Sums | None = None
        self._base = _ZERO
        self.seen = False
        """Whether any step function carried all-reduce marks: only then is the split measured."""

    def sums(self) -> _Sums:
        """The sums, created by the first mark a step function builds."""
        with self._lock:
            if self._sums is None:
                self._sums = _Sums()
            return self._sums

    @property
    def batches(self) -> int:
        """Batches the running call has taken so far (its input marks): the graph adds each as it
        arrives, while the call still runs, and this reads the variable from any thread (the metrics
        scrape), so a task blocked in its input is seen behind its peers (trainer_input_step,
        trainer/supervise/supervisor.py) even when every task is frozen in the collective."""
        return round(self._read()[INPUT][1] - self._base[INPUT][1])

    def clear(self) -> None:
        """A call starts: what was marked before now (another function's all-reduces, an evaluate,
        the tracing call) is not its own."""
        self._base = self._read()

    def _read(self) -> dict[str, tuple[float, float]]:
        return self._sums.read() if self._sums is not None else _ZERO

    def take(self) -> dict[str, float] | None:
        """Seconds of all-reduce and of input wait since clear(); None when no all-reduce was marked."""
        now, base = self._read(), self._base
        self._base = now  # read once: nothing is counted twice
        if now[ALLREDUCE][1] - base[ALLREDUCE][1] <= 0:
            return None
        self.seen = True
        return {kind: now[kind][0] - base[kind][0] for kind in now}


_ZERO = {ALLREDUCE: (0.0, 0.0), INPUT: (0.0, 0.0)}
_SLOT = {ALLREDUCE: 0, INPUT: 2}
"""Where each kind's (seconds, count) sits in the variable."""


class _Sums:
    """Each kind's seconds and count, summed by the graph into one variable the host reads at a
    call's start and end (and the scrape, for the batches). Not a numpy_function per mark (a Python
    call under the GIL in the middle of the step: ~46 us of CPU each, 7 all-reduces per step in the
    fit seed script, and the input's one per batch cost ~4 % of a 2-task custom loop's step rate), nor
    a ring of rows (a counter, an index and a scatter: four ops more per mark, run in every step): a
    subtraction and an add. The sum is the union of the spans: they never overlap, because the marks'
    Timestamp ops are stateful without a resource, and automatic control dependencies run all such
    ops in program order (each mark's start after the previous one's end)."""

    def __init__(self) -> None:
        import tensorflow as tf
        from tensorflow.python.ops import resource_variable_ops

        # Built while a step function traces: lifted out of it, and a plain variable rather than
        # whatever the strategy's scope would make of tf.Variable (a mirrored one, with a broadcast).
        with tf.init_scope():
            self.sums = resource_variable_ops.ResourceVariable(
                tf.zeros((4,), tf.float64), trainable=False, name="observe_marks"
            )

    def write(self, kind: str, start, stop) -> None:
        """In the graph (or eagerly): the span's seconds and 1 added to the kind's slots."""
        import tensorflow as tf

        with tf.device(self.sums.device):  # beside the variable (a step built under a GPU's scope)
            span = tf.convert_to_tensor(stop, tf.float64) - tf.convert_to_tensor(start, tf.float64)
            one, zero = tf.constant(1.0, tf.float64), tf.constant(0.0, tf.float64)
            row = [zero, zero, span, one] if _SLOT[kind] else [span, one, zero, zero]
            self.sums.assign_add(tf.stack(row), read_value=False)

    def read(self) -> dict[str, tuple[float, float]]:
        """On the host, between calls or from another thread: each kind's (seconds, count) so far.
        Eagerly (the hooks between calls, the scrape's thread) the variable's read op is run on its
        handle: ~9 us against ~60 us for `numpy()` under `init_scope` (measured here), which the hooks
        pay twice per call of the step function, i.e. per step at fit's default steps_per_execution."""
        import tensorflow as tf
        from tensorflow.python.ops import gen_resource_variable_ops

        if tf.executing_eagerly():
            values = (
                gen_resource_variable_ops.read_variable_op(self.sums.handle, tf.float64)._numpy().tolist()
            )
        else:
            with tf.init_scope():
                values = self.sums.numpy().tolist()
        return {kind: (values[i], values[i + 1]) for kind, i in _SLOT.items()}


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
    marks.sums().write(kind, start, stop)
    return result


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
