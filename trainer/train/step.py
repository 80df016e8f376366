"""The training step, fused into one tf.function, timed from inside with tf.timestamp().

Why this way (measured, chief + 2 workers on CPU): timestamps chained by control dependencies in
the one fused step cost 0.97-1.05x the untimed step, while host-timing split tf.functions cost up
to 1.2x and a host-side next(iterator) up to 1.2x. So the iterator is consumed inside the function
and five marks split the step:

    t_start -> next(iterator) -> t0 -> forward+backward -> t1 -> all-reduce -> t2 -> update -> t3
    input = t0 - t_start   compute = (t1 - t0) + (t3 - t2)   all-reduce = t2 - t1

t3 waits for every stateful op of the step (variable and optimizer-slot writes, batch norm's moving
averages), not only for apply_gradients' return value, which is just the iteration count's increment:
the update is compute, it must not leak into the next step (tests/unit/test_step_graph.py reads the
traced graph to check it). With --allreduce-mode overlap the all-reduce does not wait for t1: packs
(--bytes-per-pack, formed by the strategy in reverse, the order backprop produces gradients) start as
soon as their gradients exist, and t2 - t1 is the EXPOSED communication, what the step waits for
after its last gradient. With --allreduce-dtype the gradients travel cast (bfloat16/float16) and are
cast back before the update.

Several steps run per call in an in-graph loop (--steps-per-call; by default sized so a call takes
about 0.5 s, which makes the ~3 ms dispatch per call a few percent of the step time). A step lasts from the previous
step's end to its own t3; the first step of a call starts at the host's previous return and the
last ends at the host's return, so function dispatch lands in those and nothing is hidden: what
the parts do not explain is reported as dispatch ("other"). The gradients are all-reduced explicitly in replica context (together with
the loss and accuracy, in one packed collective) and applied with skip_gradients_aggregation=True,
so the reduction is a span of its own. Every task applies the same reduced values: replicas stay
bit-identical, timed or not.

GPU: an op's timestamp records when the executor launched it, not when its kernels finished, since
GPU ops only enqueue work on a stream. `_settled` therefore makes each mark wait for a device-to-host
copy of a scalar computed from the tensors it follows; the copy completes only after those kernels
(same stream), so the marks bracket device time. On CPU ops run synchronously and it is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from trainer.core.timing import StepFns
from trainer.tasks.task import Task

# The step's last timestamp (named so that tests can find it in the traced graph).
END_MARK = "step_end"
# The input step's increment: telemetry, not the step's state, so no mark waits for it.
INPUT_MARK = "input_step_taken"


@dataclass(frozen=True)
class StepOptions:
    mode: str = "serial"
    """serial: the all-reduce starts after every gradient (t1); overlap: each pack starts when ready."""
    dtype: str = "float32"
    """What the gradients are cast to for the all-reduce (cast back to float32 before the update)."""
    bytes_per_pack: int = 0
    """Packs of the all-reduce (CommunicationOptions.bytes_per_pack); 0 = one pack."""
    first_step: int = 0
    """The step the run starts at, where the input step count (trainer_input_step) starts."""

    @classmethod
    def of(cls, config) -> StepOptions:
        return cls(
            mode=config.allreduce_mode, dtype=config.allreduce_dtype, bytes_per_pack=config.bytes_per_pack
        )


def build(
    strategy: tf.distribute.Strategy,
    task: Task,
    optimizer,
    global_batch: int,
    options: StepOptions = StepOptions(),
) -> StepFns:
    """Functions running n steps per call: one dispatch serves n steps (n=1 is a plain step).

    Per call the host pays a function dispatch of a few ms (measured 2-11 ms on 2 shared cores);
    looping inside the function spreads it over n steps. The marks still time every step.
    """
    graph = _StepGraph(strategy, task, optimizer, global_batch, options)
    timed_steps, plain_steps = _functions(graph)

    def timed(iterator, n: int):
        return timed_steps(iterator, tf.constant(n, tf.int32))  # a tensor: one trace for every n

    def plain(iterator, n: int):
        return plain_steps(iterator, tf.constant(n, tf.int32))

    return StepFns(
        timed=timed,
        plain=plain,
        allreduce_bytes=payload_bytes(task.model.trainable_variables, options),
        input_step=lambda: int(graph.taken.numpy()),
    )


def payload_bytes(variables, options: StepOptions) -> int:
    """Gradient bytes each replica hands to the all-reduce per step, in the dtype actually sent."""
    return sum(v.shape.num_elements() for v in variables) * tf.as_dtype(options.dtype).size


def functions(strategy, task: Task, optimizer, global_batch: int, options: StepOptions):
    """(timed_steps, plain_steps): the tf.functions behind build(), (iterator, n tensor) -> results."""
    return _functions(_StepGraph(strategy, task, optimizer, global_batch, options))


def _functions(graph: _StepGraph):
    # No AutoGraph: the loop is an explicit tf.while_loop, and converting the step's Python (the model,
    # the optimizer, ours) cost each task ~0.8 CPU-s at every start, ~16 % of a small job's start.
    @tf.function(autograph=False)
    def timed_steps(iterator, n):
        return graph.steps(iterator, n, True)

    @tf.function(autograph=False)
    def plain_steps(iterator, n):
        return graph.steps(iterator, n, False)

    return timed_steps, plain_steps


class _StepGraph:
    """The ops of n fused steps, each marked with timestamps when timed: start, t0 (batch in hand),
    t1 (gradients), t2 (all-reduced), t3 (applied). The methods run while tracing, top-down:
    steps -> one_step -> replica_step -> all_reduce, apply."""

    def __init__(self, strategy, task: Task, optimizer, global_batch: int, options: StepOptions) -> None:
        self.strategy, self.task, self.optimizer, self.global_batch = strategy, task, optimizer, global_batch
        # Counted in the graph as each batch is taken, read by the exporter while a call runs: of a
        # stuck job's tasks, the one behind never took the batch its peers are all-reducing.
        # Not under the strategy's scope (one plain variable per task) and not in any checkpoint.
        self.taken = tf.Variable(options.first_step, dtype=tf.int64, trainable=False, name="input_step")
        self.mode = options.mode
        self.variables = task.model.trainable_variables
        self.on_gpu = bool(tf.config.list_logical_devices("GPU"))
        self.wire = tf.as_dtype(options.dtype)
        self.packing = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=options.bytes_per_pack)

    def steps(self, iterator, n, timed):
        all_marks = tf.TensorArray(tf.float64, size=n, element_shape=[5 if timed else 0])
        all_ids = tf.TensorArray(tf.int64, size=n, element_shape=[None], infer_shape=False)
        stats = tf.zeros([2], tf.float32)

        def body(i, stats, all_marks, all_ids):  # ordered: each step starts after the previous stats
            marks, stats, ids = self.one_step(iterator, stats, timed)
            return i + 1, stats, all_marks.write(i, marks), all_ids.write(i, ids)

        _, stats, all_marks, all_ids = tf.while_loop(
            lambda i, *_: i < n, body, (tf.constant(0), stats, all_marks, all_ids)
        )
        return all_marks.stack(), stats, all_ids.concat()

    def one_step(self, iterator, after, timed):
        t_start = self.mark([after], timed)
        with tf.control_dependencies([after] + t_start):  # steps in sequence, timed or not
            batch = next(iterator)
        with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
            self.taken.assign_add(1, name=INPUT_MARK)
        marks, stats, ids = self.strategy.run(self.replica_step, args=(batch, timed))
        ids = tf.concat(self.strategy.experimental_local_results(ids), 0)
        return tf.concat([_stack(t_start), self.first(marks)], 0), self.first(stats), ids

    def replica_step(self, batch, timed):
        no_ids = tf.zeros([0], tf.int64)  # not a module constant: it would initialise TF's context
        x, y, ids = (*batch, no_ids)[:3] if isinstance(batch, tuple) else (batch, None, no_ids)
        t0 = self.mark([t for t in tf.nest.flatten((x, y)) if t is not None], timed)
        since = len(_ops())
        with tf.control_dependencies(t0):
            grads, stats = self.gradients(x, y)
        t1 = self.mark(grads, timed)
        reduced, stats = self.all_reduce(grads, stats, t1)
        t2 = self.mark(reduced + [stats], timed)
        with tf.control_dependencies(t2):
            done = self.apply(reduced, since)
        t3 = self.mark(done, timed, name=END_MARK)
        with tf.control_dependencies(done):
            return _stack(t0 + t1 + t2 + t3), tf.identity(stats), tf.reshape(ids, [-1])

    def gradients(self, x, y):
        """This replica's gradients, and its (loss, accuracy) share of the global batch's."""
        task = self.task
        with tf.GradientTape() as tape:
            logits = task.model(x, training=True)
            loss = tf.nn.compute_average_loss(task.loss(y, logits), global_batch_size=self.global_batch)
            if task.model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(task.model.losses))
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, self.variables)]
        return grads, tf.stack([tf.cast(loss, tf.float32), _accuracy(task, y, logits, self.global_batch)])

    def all_reduce(self, grads, stats, t1):
        """Serial: every pack waits for t1 (all gradients). Overlap: no barrier, so the packs (which
        the strategy forms in reverse order, the order backprop produces them) start when ready."""
        barrier = t1 if self.mode == "serial" else []
        with tf.control_dependencies(barrier):
            # tf.identity: all_reduce needs tensors produced in this replica function
            sent = [tf.identity(tf.cast(g, self.wire)) for g in grads]
            ctx, total = tf.distribute.get_replica_context(), tf.distribute.ReduceOp.SUM
            if self.wire == tf.float32:  # loss and accuracy ride in the gradients' collective
                reduced = ctx.all_reduce(total, [*sent, tf.identity(stats)], options=self.packing)
                return reduced[:-1], reduced[-1]
            reduced = ctx.all_reduce(total, sent, options=self.packing)
            return [tf.cast(r, g.dtype) for r, g in zip(reduced, grads)], ctx.all_reduce(total, stats)

    def apply(self, reduced, since: int):
        """The update, waiting for every stateful op the step made since op number `since`: the
        variable writes are not ancestors of apply_gradients' return value (`iterations.assign_add`),
        nor are batch normalisation's moving averages of the loss, so the end mark waits for them."""
        applied = self.optimizer.apply_gradients(
            zip(reduced, self.variables), skip_gradients_aggregation=True
        )
        made = [op for op in _ops()[since:] if op._is_stateful]
        with tf.control_dependencies(made):
            # On GPU the end mark settles on the updated values, read after their writes.
            return [tf.identity(applied)] + (
                [tf.reshape(v.value(), [-1])[:1] for v in self.variables] if self.on_gpu else []
            )

    def mark(self, after, timed, name=None):
        if not timed:
            return []
        with tf.control_dependencies(_settled(after, self.on_gpu)):
            return [tf.timestamp(name=name)]

    def first(self, value):
        return self.strategy.experimental_local_results(value)[0]


def _ops() -> list:
    return tf.compat.v1.get_default_graph().get_operations()


def _stack(marks: list):
    return tf.stack(marks) if marks else tf.zeros([0], tf.float64)


def _accuracy(task: Task, y, logits, global_batch: int):
    if not task.classify or y is None:
        return tf.constant(0.0, tf.float32)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1), tf.cast(y, tf.int64)), tf.float32)
    return tf.reduce_sum(correct) / global_batch


def _settled(tensors, on_gpu: bool) -> list:
    if not on_gpu:
        return list(tensors)
    probe = tf.add_n([tf.cast(tf.reshape(t, [-1])[0], tf.float32) for t in tensors])
    with tf.device("/cpu:0"):
        return [tf.identity(probe)]


def learning_rate(config, scale: float):
    """--lr-scaling linear: a global batch `scale` times --per-replica-batch gets `scale` times the rate
    (Goyal et al.; `scale` is the replicas unless a resize kept the global batch), reached over a linear
    warm-up, since a large rate at the start diverges. The warm-up follows the step counter, so a
    resized job does not repeat it."""
    if config.lr_scaling == "linear":
        return WarmupLinear(config.learning_rate, config.learning_rate * scale, config.warmup_steps)
    return config.learning_rate


def describe_lr(config, replicas: int, per_replica_batch: int | None = None) -> str:
    """The start-up line saying what batch and rate the job trains with, e.g.
    `global batch 128 = 4 x 32, lr 0.04 = 4 x 0.01, warm-up 100 steps`. `per_replica_batch`: this
    segment's, when a resize that kept the global batch changed it from --per-replica-batch."""
    per = per_replica_batch or config.per_replica_batch
    scale = replicas * per / config.per_replica_batch
    batch, base = f"global batch {per * replicas} = {replicas} x {per}", config.learning_rate
    if config.lr_scaling == "linear" and scale != 1:
        warmup = f"warm-up {config.warmup_steps} steps" if config.warmup_steps else "no warm-up"
        return f"{batch}, lr {base * scale:g} = {scale:g} x {base:g} (--lr-scaling linear), {warmup}"
    return (
        f"{batch}, lr {base:g} ({'--lr-scaling none' if replicas > 1 else 'one replica: nothing to scale'})"
    )


def optimizer(config, scale: float):
    return tf.keras.optimizers.Adam(learning_rate(config, scale))


class WarmupLinear(tf.keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, base: float, target: float, warmup_steps: int) -> None:
        self.base, self.target, self.warmup_steps = base, target, warmup_steps

    def __call__(self, step):
        if self.warmup_steps == 0:
            return tf.constant(self.target, tf.float32)
        done = tf.minimum(tf.cast(step, tf.float32) / self.warmup_steps, 1.0)
        return self.base + (self.target - self.base) * done

    def get_config(self):
        return {"base": self.base, "target": self.target, "warmup_steps": self.warmup_steps}
