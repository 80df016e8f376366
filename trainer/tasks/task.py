"""Tasks: a model, its loss and a dataset function.

Built in: one module per task in this package (`mlp`: tiny, the tests'; `cnn`), each declaring a
`TaskSpec` in trainer/tasks/spec.py. Your own: `--task package.module:function`. The function is
called inside the strategy's scope (so variables are mirrored) with those keyword arguments it
declares among `per_replica_batch`, `seed`, `data` and `input_delay_ms`, and returns
`(model, loss, dataset_fn)` or a `Task`:

- `model`: a tf.keras (tf-keras) model returning logits;
- `loss(labels, logits)`: per-example losses (a Keras loss object is switched to reduction "none");
- `dataset_fn(input_context)`: a per-replica-batched tf.data.Dataset of `(x, y)` or `(x, y, ids)`,
  sharded by `input_context.input_pipeline_id`, ideally `.repeat()`ed.

TensorFlow (and the data modules that load it) is imported inside the functions, not here: listing
the built-ins (trainer/config.py does, to reject a wrong --task early) imports their modules, which
runs the package first.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from trainer.errors import ConfigError
from trainer.tasks import spec as taskspec


@dataclass(frozen=True)
class Task:
    model: object
    """A tf.keras.Model returning logits."""
    loss: Callable
    dataset_fn: Callable
    """`dataset_fn(tf.distribute.InputContext) -> tf.data.Dataset`."""
    classify: bool = False
    """Logits over classes and integer labels: the loop then also reports accuracy."""


def builtin(
    spec: taskspec.TaskSpec, *, per_replica_batch: int, seed: int, data: str = "", input_delay_ms: float = 0.0
) -> Task:
    """A built-in task: its model and loss, fed its synthetic problem or the TFRecord files `data`."""
    from trainer.data import records
    from trainer.data import synthetic as data_mod

    prob = data_mod.problem(spec.name, seed)
    read = (
        partial(records.dataset, records.Source(data, prob))
        if data
        else partial(data_mod.synthetic_dataset, prob)
    )
    dataset_fn = partial(_batched, read, per_replica_batch=per_replica_batch, input_delay_ms=input_delay_ms)
    return Task(spec.model(prob, seed), spec.loss, dataset_fn, classify=spec.classify)


def _batched(read, ctx, *, per_replica_batch, input_delay_ms, start_example=0):
    """`start_example`: the job's global example offset, where a resumed run's input picks up
    (trainer/data/synthetic.py's resumable pipelines)."""
    return read(ctx, per_replica_batch, input_delay_ms, start_example)


def load(name: str) -> Callable[..., Task | tuple]:
    """A built-in name or `package.module:function`; errors name the flag and the fix."""
    if name in taskspec.names():
        return partial(builtin, taskspec.get(name))
    module_name, sep, attr = name.partition(":")
    if not sep:
        raise ConfigError(
            f"--task {name!r}: not a built-in ({', '.join(taskspec.names())}) nor package.module:function"
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
    import tensorflow as tf

    params = inspect.signature(fn).parameters
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
    result = fn(**{k: v for k, v in kwargs.items() if takes_all or k in params})
    task = result if isinstance(result, Task) else Task(*result)
    if isinstance(task.loss, tf.keras.losses.Loss):
        task.loss.reduction = tf.keras.losses.Reduction.NONE  # we average over the global batch
    return task
