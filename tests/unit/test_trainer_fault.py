"""The stuck-task fault hook (trainer/core/fault.py, acting in trainer/train/fault.py) and the input step it is found by
(trainer/train/step.py)."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from trainer.config import from_args
from trainer.core import fault
from trainer.errors import ConfigError
from trainer.train import fault as fault_hooks


def test_a_fault_names_a_task_a_kind_and_a_step() -> None:
    def fields(f: fault.Fault) -> tuple:
        return f.task, f.kind, f.step

    assert fields(fault.Fault.parse("worker-1:input-block@40")) == ("worker-1", "input-block", 40)
    assert fields(fault.Fault.parse("chief:hang@7")) == ("chief", "hang", 7)
    assert fault.Fault.parse("") is None


@pytest.mark.parametrize(
    "text", ["worker-1", "worker-1:sleep@4", "worker-1:hang@", "worker-1:hang@0", ":hang@3"]
)
def test_a_bad_fault_is_one_line_naming_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--fault \(TRAINER_FAULT\)"):
        fault.Fault.parse(text)
    with pytest.raises(ConfigError, match=r"--fault \(TRAINER_FAULT\)"):
        from_args([], {"TRAINER_FAULT": text})


def test_only_the_task_named_acts_and_only_once_per_container(tmp_path: Path) -> None:
    f = fault.Fault("worker-1", "hang", 5, marker_dir=str(tmp_path))
    assert (
        f.armed("worker-1", "hang")
        and not f.armed("worker-0", "hang")
        and not f.armed("worker-1", "input-block")
    )
    blocked = threading.Thread(target=f.fire, args=(5,), daemon=True)
    blocked.start()
    blocked.join(timeout=0.5)
    assert blocked.is_alive(), "fire blocks for ever"
    assert not f.armed("worker-1", "hang"), "the next run trains through"


def test_the_input_step_moves_inside_a_call_and_stops_below_the_blocked_batch(tmp_path: Path) -> None:
    import tensorflow as tf

    import trainer  # noqa: F401 (TF_USE_LEGACY_KERAS)
    from trainer.assembly import task as tasks
    from trainer.config import Config
    from trainer.train import step

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    cfg = Config(task="mlp", strategy="mirrored")
    with strategy.scope():
        task = tasks.build(tasks.load("mlp"), per_replica_batch=8, seed=0, data="", input_delay_ms=0.0)
        opt = step.optimizer(cfg, 1)
        opt.build(task.model.trainable_variables)
    start, blocked = 100, fault.Fault("chief", "input-block", 106, marker_dir=str(tmp_path))
    fns = step.build(strategy, task, opt, 8, dataclasses.replace(step.StepOptions.of(cfg), first_step=start))
    iterator = iter(
        strategy.distribute_datasets_from_function(
            lambda ctx: fault_hooks.block_input(task.dataset_fn(ctx), start, blocked)
        )
    )
    assert fns.input_step() == start
    fns.plain(iterator, 2)
    assert fns.input_step() == start + 2
    call = threading.Thread(target=fns.plain, args=(iterator, 10), daemon=True)  # steps 103..112
    call.start()
    deadline = time.monotonic() + 60
    while fns.input_step() < 105 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert call.is_alive() and fns.input_step() == 105, (
        "read while the call runs; step 106's batch never came"
    )
