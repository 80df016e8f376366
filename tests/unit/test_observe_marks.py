"""The marks a step function's graph carries (trainer/observe/marks.py), built and run by real
TensorFlow in one process: the all-reduce and input spans are summed in variables by the graph and
reach the host once per call, with no Python call in the step; the batches taken are readable while
the call runs."""

from __future__ import annotations

import time

import tensorflow as tf

import trainer  # noqa: F401 (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)
from trainer.observe import marks

SLEEP_S = 0.01
PACKS, STEPS = 2, 3


def _slow(x):
    time.sleep(SLEEP_S)
    return x


def _step_function(sink: marks.Marks, kind: str = marks.ALLREDUCE):
    """An in-graph loop of STEPS steps (as fit's steps_per_execution builds), each with PACKS marked
    spans of a slow op: what the wrapped all-reduce (or get_next) builds around MWMS's own."""

    def pack(x):
        build = lambda: tf.ensure_shape(tf.numpy_function(_slow, [x], tf.float32), ())  # noqa: E731
        return marks._bracket(sink, kind, build, lambda out: [out])

    @tf.function
    def call(x):
        for _ in tf.range(STEPS):
            for _ in range(PACKS):
                x = pack(x)
        return x

    return call


def _op_types(fn, *args) -> list[str]:
    graph = fn.get_concrete_function(*args).graph.as_graph_def()
    return [n.op for f in graph.library.function for n in f.node_def] + [n.op for n in graph.node]


def test_every_all_reduce_of_every_step_reaches_the_host_once_per_call():
    sink, x = marks.Marks(), tf.constant(1.0)
    call = _step_function(sink)
    call(x)  # traces: its spans are not the next call's
    sink.clear()
    start = time.perf_counter()
    call(x)
    wall = time.perf_counter() - start
    taken = sink.take()
    assert sink.seen
    spans = PACKS * STEPS
    assert spans * SLEEP_S <= taken[marks.ALLREDUCE] <= wall, (taken, wall)
    assert taken[marks.INPUT] == 0
    assert sink.take() is None  # read once: nothing is counted twice


def test_an_all_reduce_before_the_call_is_not_its_own():
    sink, x = marks.Marks(), tf.constant(1.0)
    call = _step_function(sink)
    call(x)
    call(x)  # e.g. another function's all-reduces between two hooked calls
    sink.clear()
    assert sink.take() is None


def test_the_marks_run_no_python_in_the_step():
    """A numpy_function per pack was ~46 us of CPU under the GIL each (7 per step of the fit seed
    script), a ring of rows four ops more per pack than a subtraction and an add; a numpy_function per
    batch cost ~4 % of a 2-task custom loop's steps/s."""
    for kind in (marks.ALLREDUCE, marks.INPUT):
        sink = marks.Marks()
        ops = _op_types(_step_function(sink, kind), tf.constant(1.0))
        assert ops.count("PyFunc") == PACKS, kind  # the slow ops of this test only
        assert ops.count("AssignAddVariableOp") == PACKS and "ResourceScatterNdUpdate" not in ops


def test_the_sum_of_the_spans_is_their_union_even_for_independent_all_reduces():
    """Two all-reduces with nothing between them could run at once; their marks run in program order
    (automatic control dependencies chain stateful ops without a resource), so the second starts after
    the first ends and the summed seconds never exceed the time that passed."""
    sink, x = marks.Marks(), tf.constant(1.0)

    def pack(v):
        build = lambda: tf.ensure_shape(tf.numpy_function(_slow, [v], tf.float32, stateful=False), ())  # noqa: E731
        return marks._bracket(sink, marks.ALLREDUCE, build, lambda out: [out])

    @tf.function
    def call(v):
        return pack(v) + pack(v * 2.0)

    call(x)
    sink.clear()
    start = time.perf_counter()
    call(x)
    wall = time.perf_counter() - start
    taken = sink.take()[marks.ALLREDUCE]
    assert 2 * SLEEP_S <= taken <= wall, (taken, wall)


def test_a_batch_is_counted_as_it_arrives_and_readable_while_the_call_runs():
    """The input step of a task blocked mid-call (trainer_input_step, read by the metrics scrape from
    another thread) counts batches as they come."""
    sink, x, seen = marks.Marks(), tf.constant(1.0), []

    def look(v):
        seen.append(sink.batches)  # from TensorFlow's thread, inside the running call
        return v

    @tf.function
    def call(v):
        for _ in tf.range(STEPS):
            for _ in range(PACKS):
                build = lambda: tf.ensure_shape(tf.numpy_function(look, [v], tf.float32), ())  # noqa: E731,B023
                v = marks._bracket(sink, marks.INPUT, build, lambda out: [out])
        return v

    call(x)  # traces and creates the variable
    sink.clear()
    seen.clear()
    call(x)
    # The k-th batch's wait sees the batches before it; the previous one's add may still be queued.
    assert seen == sorted(seen) and all(k - 1 <= n <= k for k, n in enumerate(seen)), seen
    assert seen[-1] > 0
    assert sink.batches == PACKS * STEPS
    assert sink.take() is None  # no all-reduce marked: no split
    assert sink.batches == 0


def test_the_sums_are_written_beside_their_variable_under_a_gpu_scope():
    """A step built under `tf.device('/gpu:0')` (the GPU image's trainer, a user's script) still
    adds to the sums on the CPU that holds them."""
    sink = marks.Marks()
    sink.sums()  # created outside the scope, as the first trace does under init_scope

    @tf.function
    def call(x):
        with tf.device("/gpu:0"):
            return marks._bracket(sink, marks.ALLREDUCE, lambda: x * 2.0, lambda out: [out])

    graph = call.get_concrete_function(tf.constant(1.0)).graph
    adds = [op for op in graph.get_operations() if op.type == "AssignAddVariableOp"]
    assert len(adds) == 1 and "CPU" in adds[0].device, [(o.type, o.device) for o in adds]
