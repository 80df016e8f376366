"""Where an injected fault (trainer/core/fault.py, --fault, docs/faults.md) acts: in the host loop (an
after-call action, `hang`), in the input pipeline (`input-block`) or in the checkpoint writer, between a
save's files and its manifest (`save-block`). TensorFlow only inside `block_input`.
"""

from __future__ import annotations

from trainer.core.fault import Fault


def hang_action(fault: Fault | None):
    """A loop action (trainer/train/loop.py): blocks the host loop once the step reaches the fault's."""

    def act(out) -> None:
        if fault is not None and out.step >= fault.step:
            fault.fire(out.step)

    return act


def block_input(dataset, first_step: int, fault: Fault):
    """`dataset` whose element for step `fault.step` never comes (element k feeds step first_step+k+1)."""
    import tensorflow as tf

    def check(k):
        if first_step + int(k) + 1 == fault.step:
            fault.fire(fault.step)
        return k

    def fn(k, batch):
        seen = tf.py_function(check, [k], tf.int64)
        with tf.control_dependencies([seen]):
            return tf.nest.map_structure(tf.identity, batch)

    return dataset.enumerate().map(fn)


def save_block(fault: Fault | None):
    """A checkpoint writer's hook (trainer/state/checkpoint.py): the save of the fault's step (or the
    first past it) blocks before its manifest, its files written: a kill then finds a save without one."""

    def act(step: int) -> None:
        if fault is not None and step >= fault.step:
            fault.fire(step)

    return act
