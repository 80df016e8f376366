"""A SCRIPT= run's target steps come from the script's own run, never from the stack's STEPS: `make up`
sets TRAINER_STEPS (its default 8000) whether or not the script reads it, and a custom loop training
6000 steps showed `step 3920 of 8000` (issue 29)."""

from __future__ import annotations

import subprocess
import sys

from tests.cluster.local import ROOT

PROBE = """
from prometheus_client import CollectorRegistry
import contract
from trainer import observe
from trainer.cluster.spec import TaskId
from trainer.telemetry.metrics import Metrics
registry = CollectorRegistry()
sampler = observe.install(Metrics(registry, TaskId("chief", 0)), {"TRAINER_STEPS": "8000"})
sampler.close()
print([s.value for m in registry.collect() for s in m.samples if s.name == contract.TARGET_STEPS.name])
"""


def test_the_stacks_steps_are_not_the_scripts_target() -> None:
    # A process of its own: install() wraps tf-keras and tf.function for good.
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "[0.0]", out.stdout  # 0: the exporter's "unknown"


RESUMED = """
import os, sys
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
from prometheus_client import CollectorRegistry
import contract
from trainer import observe
from trainer.cluster.spec import TaskId
from trainer.telemetry.metrics import Metrics
registry = CollectorRegistry()
sampler = observe.install(Metrics(registry, TaskId("chief", 0)), {})
import tensorflow as tf
import tf_keras

class Stop(tf_keras.callbacks.Callback):  # the first start is killed in epoch 3 (index 2)
    def on_train_batch_end(self, batch, logs=None):
        if sys.argv[2] == "first" and self.model.optimizer.iterations.numpy() >= 12:
            raise KeyboardInterrupt

with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():  # a strategy with devices, as MWMS
    model = tf_keras.Sequential([tf_keras.layers.Input((4,)), tf_keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
ds = tf.data.Dataset.from_tensor_slices((tf.ones((8, 4)), tf.ones((8, 1)))).repeat().batch(2, drop_remainder=True)
try:
    model.fit(ds, epochs=6, steps_per_epoch=5, verbose=0,
              callbacks=[tf_keras.callbacks.BackupAndRestore(sys.argv[1]), Stop()])
except KeyboardInterrupt:
    pass
sampler.close()
print([s.value for m in registry.collect() for s in m.samples if s.name == contract.TARGET_STEPS.name])
"""


def test_a_fit_resumed_by_backup_and_restore_targets_its_epochs_once(tmp_path) -> None:
    """Its start after a resize or a restart: 6 epochs of 5 steps are 30 steps, not 10 + 30."""
    for start in ("first", "again"):
        out = subprocess.run(
            [sys.executable, "-c", RESUMED, str(tmp_path / "backup"), start],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split()[-1] == "[30.0]", (start, out.stdout, out.stderr[-1500:])
