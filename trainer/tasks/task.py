"""The task protocol: a model, its loss and a dataset function, and `build`, which calls a task function.

Built in: one module per task in this package (`mlp`: tiny, the tests'; `cnn`), each declaring a
`TaskSpec` in trainer/tasks/spec.py. Your own: `--task package.module:function`. The function is
called inside the strategy's scope (so variables are mirrored) with those keyword arguments it
declares among `per_replica_batch`, `seed`, `data` and `input_delay_ms`, and returns
`(model, loss, dataset_fn)` or a `Task`:

- `model`: a tf.keras (tf-keras) model returning logits;
- `loss(labels, logits)`: per-example losses (a Keras loss object is switched to reduction "none");
- `dataset_fn(input_context)`: a per-replica-batched tf.data.Dataset of `(x, y)` or `(x, y, ids)`,
  sharded by `input_context.input_pipeline_id`, ideally `.repeat()`ed.

Which function a --task names, and a built-in's input, are chosen above this folder
(trainer/assembly/task.py): the input pipelines (trainer/data/) read a task's problem from this
folder's registry (spec.py), so nothing here imports them. TensorFlow is imported inside `build`, not here: listing the built-ins
(trainer/config.py does, to reject a wrong --task early) imports their modules, which runs the package
first.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    model: object
    """A tf.keras.Model returning logits."""
    loss: Callable
    dataset_fn: Callable
    """`dataset_fn(tf.distribute.InputContext) -> tf.data.Dataset`."""
    classify: bool = False
    """Logits over classes and integer labels: the loop then also reports accuracy."""


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
