"""A user's MultiWorkerMirroredStrategy `model.fit` script, written as users write it.

Nothing of this project is imported. Knobs a test may set: STEPS_PER_EPOCH, EPOCHS,
STEPS_PER_EXECUTION, BATCH, INPUT_DELAY_S (a slow map in the input pipeline), VERBOSE.
"""

import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
batch = int(os.environ.get("BATCH", "32")) * strategy.num_replicas_in_sync
delay = float(os.environ.get("INPUT_DELAY_S", "0"))


def slow(x, y):
    if delay:
        time.sleep(delay)
    return x, y


def make_dataset():
    rng = tf.random.Generator.from_seed(1)
    x = rng.normal((1024, 28, 28, 1))
    y = tf.cast(tf.reduce_sum(x, axis=[1, 2, 3]) > 0, tf.int64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)
    if delay:
        ds = ds.map(lambda a, b: tf.numpy_function(slow, [a, b], (tf.float32, tf.int64)))
        ds = ds.map(lambda a, b: (tf.ensure_shape(a, (batch, 28, 28, 1)), tf.ensure_shape(b, (batch,))))
    return ds


class PrintEpoch(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.start, self.cpu = time.perf_counter(), time.process_time()

    def on_epoch_end(self, epoch, logs=None):
        seconds, cpu = time.perf_counter() - self.start, time.process_time() - self.cpu
        print(f"epoch {epoch} done, loss {logs['loss']:.4f}, {seconds:.3f} s, {cpu:.3f} s CPU", flush=True)


with strategy.scope():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((28, 28, 1)),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(2),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(1e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=int(os.environ.get("STEPS_PER_EXECUTION", "10")),
    )

model.fit(
    make_dataset(),
    epochs=int(os.environ.get("EPOCHS", "2")),
    steps_per_epoch=int(os.environ.get("STEPS_PER_EPOCH", "100")),
    callbacks=[PrintEpoch()],
    verbose=int(os.environ.get("VERBOSE", "2")),
)
