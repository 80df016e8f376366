"""A user's Keras `fit` script, unmodified for this project: MWMS, `BackupAndRestore` in the directory
the stack hands it (TRAINER_CHECKPOINT_DIR), one line per finished epoch. tests/e2e/test_faults.py
kills a worker mid-run and checks that every epoch is finished exactly once."""

import os
import time

import tensorflow as tf

EPOCHS = int(os.environ.get("EPOCHS", "8"))
STEPS_PER_EPOCH = 40
BATCH_DELAY_S = 0.05  # a few seconds an epoch, so a fault lands mid-run

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential(
        [tf.keras.layers.Input((16,)), tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(1)]
    )
    model.compile(optimizer="sgd", loss="mse")
x = tf.random.stateless_normal((1024, 16), seed=(1, 2))
data = tf.data.Dataset.from_tensor_slices((x, tf.reduce_sum(x, axis=1, keepdims=True))).repeat().batch(32)


class Progress(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(BATCH_DELAY_S)

    def on_epoch_end(self, epoch, logs=None):  # after BackupAndRestore's save: listed after it
        print(f"epoch {epoch + 1}/{EPOCHS} done, loss {logs['loss']:.4f}", flush=True)


model.fit(
    data,
    epochs=EPOCHS,
    steps_per_epoch=STEPS_PER_EPOCH,
    callbacks=[tf.keras.callbacks.BackupAndRestore(os.environ["TRAINER_CHECKPOINT_DIR"]), Progress()],
    verbose=0,
)
