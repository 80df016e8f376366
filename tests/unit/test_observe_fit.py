"""trainer/observe/fit.py: every call of fit's train_function is timed and counted, and observing it
does not make Keras call every callback's batch hooks (a plain fit at verbose=2 calls none; with a
batch-hook callback of ours Keras' ProgbarLogger walked the model's layers on every batch)."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry

import contract as c
from trainer.cluster.spec import TaskId
from trainer.observe import fit
from trainer.observe.record import Recorder
from trainer.telemetry.metrics import Metrics


def test_fit_is_observed_every_call_without_the_other_callbacks_batch_hooks(monkeypatch):
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf
    import tf_keras

    lists = tf_keras.callbacks.CallbackList
    for cls, name in (
        (tf_keras.Model, "fit"),
        (lists, "on_train_batch_begin"),
        (lists, "on_train_batch_end"),
    ):
        monkeypatch.setattr(cls, name, getattr(cls, name))  # restored after the test
    progbar = []
    batch_end = tf_keras.callbacks.ProgbarLogger.on_train_batch_end
    monkeypatch.setattr(
        tf_keras.callbacks.ProgbarLogger,
        "on_train_batch_end",
        lambda self, batch, logs=None: (progbar.append(batch), batch_end(self, batch, logs)),
    )
    registry = CollectorRegistry()
    fit.install(Recorder(Metrics(registry, TaskId("chief", 0))))

    model = tf_keras.Sequential([tf_keras.layers.Input((4,)), tf_keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=2)
    data = tf.data.Dataset.from_tensor_slices((tf.ones((8, 4)), tf.ones((8, 1)))).repeat().batch(4)
    model.fit(data, epochs=2, steps_per_epoch=6, verbose=2)

    def value(name):
        return registry.get_sample_value(name, {"task_type": "chief", "task_index": "0"})

    assert value(c.STEPS.name) == 12 and value(c.GLOBAL_STEP.name) == 12  # 6 calls of 2 steps
    assert value(c.STEP.count) == 12 - 2  # the tracing call's 2 steps count, its time is not a step's
    assert value(c.TARGET_STEPS.name) == 12  # epochs x steps per epoch
    assert progbar == []  # as in a plain fit at verbose=2: no callback's batch hooks called
