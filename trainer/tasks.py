"""Tasks: a model, its loss and a dataset function. Built in: `mlp` (tiny, tests) and `cnn`.

Your own: `--task package.module:function`. The function is called inside the strategy's scope
(so variables are mirrored) with those keyword arguments it declares among `per_replica_batch`,
`seed`, `data` and `input_delay_ms`, and returns `(model, loss, dataset_fn)` or a `Task`:

- `model`: a tf.keras (tf-keras) model returning logits;
- `loss(labels, logits)`: per-example losses (a Keras loss object is switched to reduction "none");
- `dataset_fn(input_context)`: a per-replica-batched tf.data.Dataset of `(x, y)` or `(x, y, ids)`,
  sharded by `input_context.input_pipeline_id`, ideally `.repeat()`ed.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import tensorflow as tf

from trainer import data, records
from trainer.config import BUILTIN_TASKS
from trainer.data import problem
from trainer.errors import ConfigError


@dataclass(frozen=True)
class Task:
    model: tf.keras.Model
    loss: Callable
    dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset]
    classify: bool = False
    """Logits over classes and integer labels: the loop then also reports accuracy."""


def _sparse_ce(labels, logits):
    return tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def _dataset_fn(name: str, *, per_replica_batch: int, seed: int, data: str, input_delay_ms: float):
    prob = problem(name, seed)
    if data:
        return partial(
            records.dataset, data, prob, per_replica_batch=per_replica_batch, input_delay_ms=input_delay_ms
        )
    return partial(_synthetic, prob, per_replica_batch=per_replica_batch, input_delay_ms=input_delay_ms)


def _synthetic(prob, ctx, *, per_replica_batch, input_delay_ms, start_batch=0):
    return data.synthetic_dataset(prob, ctx, per_replica_batch, input_delay_ms, start_batch)


def mlp(*, per_replica_batch: int, seed: int, data: str = "", input_delay_ms: float = 0.0) -> Task:
    prob = problem("mlp", seed)
    init = partial(tf.keras.initializers.GlorotUniform, seed=seed)
    model = tf.keras.Sequential(
        [
            tf.keras.Input(prob.input_shape),
            tf.keras.layers.Dense(64, activation="relu", kernel_initializer=init()),
            tf.keras.layers.Dense(64, activation="relu", kernel_initializer=init()),
            tf.keras.layers.Dense(prob.num_classes, kernel_initializer=init()),
        ]
    )
    return Task(
        model,
        _sparse_ce,
        _dataset_fn(
            "mlp", per_replica_batch=per_replica_batch, seed=seed, data=data, input_delay_ms=input_delay_ms
        ),
        classify=True,
    )


def cnn(*, per_replica_batch: int, seed: int, data: str = "", input_delay_ms: float = 0.0) -> Task:
    """A small ResNet: strided stems and residual blocks with BatchNorm, then a linear head."""
    prob = problem("cnn", seed)
    layers = tf.keras.layers
    init = partial(tf.keras.initializers.HeNormal, seed=seed)

    def block(x, filters):
        y = layers.Conv2D(filters, 3, padding="same", use_bias=False, kernel_initializer=init())(x)
        y = layers.ReLU()(layers.BatchNormalization()(y))
        y = layers.Conv2D(filters, 3, padding="same", use_bias=False, kernel_initializer=init())(y)
        return layers.ReLU()(layers.Add()([x, layers.BatchNormalization()(y)]))

    inputs = tf.keras.Input(prob.input_shape)
    x = layers.Conv2D(16, 3, strides=2, padding="same", kernel_initializer=init())(inputs)
    x = block(x, 16)
    x = layers.Conv2D(32, 3, strides=2, padding="same", kernel_initializer=init())(x)
    x = block(x, 32)
    outputs = layers.Dense(prob.num_classes, kernel_initializer=tf.keras.initializers.GlorotUniform(seed))(
        layers.Flatten()(x)
    )
    model = tf.keras.Model(inputs, outputs, name="resnet_small")
    return Task(
        model,
        _sparse_ce,
        _dataset_fn(
            "cnn", per_replica_batch=per_replica_batch, seed=seed, data=data, input_delay_ms=input_delay_ms
        ),
        classify=True,
    )


BUILTIN = {"mlp": mlp, "cnn": cnn}
assert tuple(BUILTIN) == BUILTIN_TASKS, "config.BUILTIN_TASKS names the built-ins before TensorFlow loads"


def load(name: str) -> Callable[..., Task | tuple]:
    """A built-in name or `package.module:function`; errors name the flag and the fix."""
    if name in BUILTIN:
        return BUILTIN[name]
    module_name, sep, attr = name.partition(":")
    if not sep:
        raise ConfigError(
            f"--task {name!r}: not a built-in ({', '.join(BUILTIN)}) nor package.module:function"
        )
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"--task {name!r}: cannot load it ({err})") from None


def from_config(config, task_name: str | None = None) -> Task:
    """The task a trainer config names (or `task_name`), built with the config's batch, seed and data."""
    return build(
        load(task_name or config.task),
        per_replica_batch=config.per_replica_batch,
        seed=config.seed,
        data=config.data,
        input_delay_ms=config.input_delay_ms,
    )


def build(fn: Callable[..., Task | tuple], **kwargs) -> Task:
    """Call a task function with the keyword arguments it accepts; normalise its result to a Task."""
    params = inspect.signature(fn).parameters
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
    result = fn(**{k: v for k, v in kwargs.items() if takes_all or k in params})
    task = result if isinstance(result, Task) else Task(*result)
    if isinstance(task.loss, tf.keras.losses.Loss):
        task.loss.reduction = tf.keras.losses.Reduction.NONE  # we average over the global batch
    return task
