"""The task registry: built-ins found by name, each declaring its own data problem; an unknown name
and a duplicate name refused. No TensorFlow is needed to list or look up a task."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from trainer.data import synthetic as data
from trainer.errors import ConfigError
from trainer.tasks import spec as taskspec


def test_builtins_are_found_by_name():
    assert set(taskspec.names()) >= {"mlp", "cnn"}
    assert all(taskspec.get(name).name == name for name in taskspec.names())


def test_unknown_task_lists_the_builtins():
    with pytest.raises(ConfigError, match=r"--task 'nope': not a built-in task \(.*mlp.*\)"):
        taskspec.get("nope")


def test_a_duplicate_name_is_refused():
    spec = taskspec.get("mlp")
    taskspec.register(spec)  # the same spec again (a module imported twice) is harmless
    with pytest.raises(ValueError, match="'mlp' is registered twice"):
        taskspec.register(replace(spec, summary="another mlp"))


def test_each_task_gets_its_own_problem():
    """The trap this registry closes: data.problem gave every task that was not `mlp` the cnn problem."""
    for name in taskspec.names():
        prob = data.problem(name, seed=3)
        assert (prob.input_shape, prob.num_classes) == (
            taskspec.get(name).problem.input_shape,
            taskspec.get(name).problem.num_classes,
        )
        assert prob.seed == 3


def test_registry_does_not_import_tensorflow():
    code = "import sys; from trainer.tasks import spec; spec.names(); assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


def test_an_unknown_task_has_no_data_problem():
    """Before the registry, data.problem('anything') silently returned the cnn problem."""
    with pytest.raises(ConfigError, match="'resnet': not a built-in task"):
        data.problem("resnet", 0)
