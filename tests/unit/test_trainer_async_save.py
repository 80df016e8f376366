"""The asynchronous save's writer logic, in-process (one replica, a tiny model): the manifest appears only
once the files are written, one save at a time, a writer's error named with its step, a bounded settle."""

import logging
import os
import threading

import numpy as np
import pytest

import trainer  # noqa: F401 (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)

# isort: split
import tensorflow as tf

from trainer.state import checkpoint, manifest

SETTINGS = {"task": "tiny"}


class Gate:
    """A before_publish hook that holds the writer on the steps it is told to, until released."""

    def __init__(self, *held: int, error: Exception | None = None) -> None:
        self.held, self.error = set(held), error
        self.reached, self.release = threading.Event(), threading.Event()

    def __call__(self, step: int) -> None:
        if step in self.held:
            self.reached.set()
            assert self.release.wait(30), "the test never released the writer"
        if self.error is not None:
            raise self.error


def _checkpointer(folder, gate=None, durable=None, asynchronous=True):
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    record = checkpoint.Record(
        SETTINGS,
        asynchronous=asynchronous,
        durable=durable,
        before_publish=gate,
    )
    return checkpoint.Checkpointer(
        checkpoint.Place(str(folder), "chief", True), model, optimizer, record
    ), model


def test_the_manifest_appears_only_once_the_write_is_done(tmp_path):
    gate, durable = Gate(2), []
    ckpt, _ = _checkpointer(tmp_path, gate, durable.append)
    ckpt.save(1)
    ckpt.save(2)  # waits for 1, then hands 2 off: its writer holds before the manifest
    try:
        assert gate.reached.wait(30)
        assert not os.path.exists(manifest.manifest_path(str(tmp_path / "ckpt-2")))
        assert manifest.files_of(str(tmp_path / "ckpt-2")), "its files are written"
        assert manifest.scan(str(tmp_path)).step == 1, "what a kill now restores"
        assert durable == [1]
    finally:
        gate.release.set()
    ckpt.wait()
    assert manifest.damage(str(tmp_path / "ckpt-2")) is None and durable == [1, 2]


def test_one_save_in_flight_the_next_waits_for_it(tmp_path):
    gate = Gate(1)
    ckpt, _ = _checkpointer(tmp_path, gate)
    ckpt.save(1)
    assert gate.reached.wait(30)
    second = threading.Thread(target=ckpt.save, args=(2,))
    second.start()
    second.join(0.5)
    try:
        assert second.is_alive(), "the second save went on while the first was not durable"
    finally:
        gate.release.set()
    second.join(30)
    ckpt.wait()
    assert manifest.scan(str(tmp_path)).step == 2


def test_a_writer_error_is_raised_with_its_step_and_the_previous_save_intact(tmp_path):
    ckpt, _ = _checkpointer(tmp_path)
    ckpt.save(1)
    ckpt.wait()
    failing, _ = _checkpointer(tmp_path, Gate(error=OSError(28, "No space left on device")))
    failing.save(2)
    with pytest.raises(checkpoint.SaveError, match=r"saving checkpoint step 2 .*No space left"):
        failing.wait()
    assert manifest.scan(str(tmp_path)).step == 1
    assert not manifest.files_of(str(tmp_path / "ckpt-2")), "the partial files are removed"


def test_settle_is_bounded_and_leaves_the_save_unpublished(tmp_path, caplog):
    gate = Gate(1)
    ckpt, _ = _checkpointer(tmp_path, gate)
    ckpt.save(1)
    assert gate.reached.wait(30)
    with caplog.at_level(logging.WARNING):
        ckpt.settle(timeout=0.3)
    assert "did not finish within" in caplog.text
    assert manifest.scan(str(tmp_path)).step is None
    gate.release.set()


def test_an_asynchronous_save_restores_the_values_it_was_handed(tmp_path):
    ckpt, model = _checkpointer(tmp_path)
    saved = [v.numpy().copy() for v in model.variables]
    ckpt.save(3)
    for v in model.variables:  # training goes on while the writer writes: the copy was taken at the hand-off
        v.assign(v + 1.0)
    ckpt.wait()
    again, restored = _checkpointer(tmp_path, asynchronous=False)
    assert again.restore() == str(tmp_path / "ckpt-3")
    for want, got in zip(saved, restored.variables):
        np.testing.assert_array_equal(want, got.numpy())
