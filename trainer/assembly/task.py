"""Which task a config names: a built-in bound to its input (its synthetic problem or --data's TFRecord
files), or your `package.module:function`; `build` (trainer/tasks/task.py) then calls it.

Here, above both trainer/tasks/ and trainer/data/, because it joins them: a built-in's model and loss
come from the registry, its input from the pipelines, which read the task's problem from the registry.
TensorFlow (and the data modules that load it) is imported inside `builtin`, not here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial

from trainer.errors import ConfigError
from trainer.tasks import spec as taskspec
from trainer.tasks.task import Task, build


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
