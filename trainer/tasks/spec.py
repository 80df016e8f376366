"""The registry of built-in tasks: each is one module of trainer/tasks/ that declares a `TaskSpec`
(its model, its loss and its synthetic data problem) and registers it; `get` finds one by name.

Standard library only, and so are the task modules at import time (they import TensorFlow inside
their model function): trainer/config.py lists the built-ins to reject a wrong --task before
TensorFlow's ~6 s import.

A new built-in task is one new module in trainer/tasks/: `get` and `names` import every module of
that package once, and each calls `register` with its spec (as torchtitan's train_spec registry).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Problem:
    """A built-in task's synthetic problem (trainer/data/synthetic.py `Synthetic` without its seed, which the run's
    --seed gives): `input_shape` features, `num_classes` classes from a fixed random teacher."""

    input_shape: tuple[int, ...]
    num_classes: int
    num_examples: int
    pool: int = 1
    """Images are average-pooled by this before the teacher sees them (a spatial, learnable signal)."""


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    name: str
    """What --task names it."""
    summary: str
    """One line for --help and the docs."""
    problem: Problem
    model: Callable
    """`model(problem, seed) -> tf.keras.Model` returning logits; called inside the strategy's scope."""
    loss: Callable
    """`loss(labels, logits)`: per-example losses."""
    classify: bool = True
    """Logits over classes and integer labels: the loop then also reports accuracy."""


_SPECS: dict[str, TaskSpec] = {}
_DISCOVERED: list[bool] = []


def register(spec: TaskSpec) -> TaskSpec:
    """Add a built-in task; a second task of the same name is refused (it would silently replace one)."""
    if spec.name in _SPECS and _SPECS[spec.name] is not spec:
        raise ValueError(f"task {spec.name!r} is registered twice: rename one of them")
    _SPECS[spec.name] = spec
    return spec


def _discover() -> None:
    """Import every module of trainer/tasks/ once: each built-in task registers itself on import."""
    if _DISCOVERED:
        return
    _DISCOVERED.append(True)
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if module.name not in ("spec", "task"):
            importlib.import_module(f"trainer.tasks.{module.name}")


def names() -> tuple[str, ...]:
    """The built-in tasks' names, in registration order (module name order)."""
    _discover()
    return tuple(_SPECS)


def get(name: str) -> TaskSpec:
    """The built-in task `name`; an unknown name is a ConfigError that lists the known ones."""
    _discover()
    if name not in _SPECS:
        raise ConfigError(f"--task {name!r}: not a built-in task ({', '.join(_SPECS)})")
    return _SPECS[name]


def sparse_ce(labels, logits):
    """Per-example cross-entropy of integer labels against logits: the built-in tasks' loss."""
    import tensorflow as tf

    return tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
