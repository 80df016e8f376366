"""All-reduce payloads shaped like real gradients, for the benchmarks.

The built-in tasks' variables (read from their models), and a ResNet-50's trainable tensors without
the convolution biases its batch norms make useless: 161 tensors, 25.6 M parameters (the list that
Horovod and NVIDIA's all-reduce benchmarks quote).
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf


def resnet50_like() -> list[tuple[int, ...]]:
    """The shapes, read from tf-keras' ResNet50 (built without weights: nothing is downloaded)."""
    model = tf.keras.applications.ResNet50(weights=None)
    return [tuple(v.shape) for v in model.trainable_variables if not ("conv" in v.name and "bias" in v.name)]


def all_reduce_fn(strategy: tf.distribute.Strategy, shapes, dtype: str) -> Callable[[], None]:
    """One blocking all-reduce of float32 tensors of `shapes`, cast to `dtype` for the collective and
    back (as the trainer's --allreduce-dtype does, casts included)."""
    with strategy.scope():
        values = [tf.random.stateless_uniform(s, seed=[i, 0]) for i, s in enumerate(shapes)]
    wire = tf.as_dtype(dtype)

    def replica():
        ctx = tf.distribute.get_replica_context()
        reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [tf.cast(v, wire) for v in values])
        return tf.add_n([tf.cast(tf.reshape(r, [-1])[0], tf.float32) for r in reduced])

    @tf.function
    def run():
        return strategy.run(replica)

    return lambda: strategy.experimental_local_results(run())[0].numpy()


def task_shapes(name: str) -> list[tuple[int, ...]]:
    """The trainable variables' shapes of a built-in task's model (`mlp`, `cnn`): its gradient list."""
    from trainer.host import tasks

    task = tasks.build(tasks.load(name), per_replica_batch=1, seed=0)
    return [tuple(v.shape) for v in task.model.trainable_variables]


NAMED = {"mlp": lambda: task_shapes("mlp"), "cnn": lambda: task_shapes("cnn"), "resnet50": resnet50_like}
"""Gradient-shaped payloads by name, for bench-comm's `--payloads`."""
