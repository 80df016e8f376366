"""A team's Keras `model.fit` script, as users write it: MultiWorkerMirroredStrategy, a small CNN on
images decoded in a tf.data map, a progress callback. Nothing of this project is imported.

    python fit_images.py [--batch 64] [--decode-ms 0] [--epochs 1000]

--decode-ms stands for a slow decode step (a Python function per batch, as a `tf.py_function` that
opens files or calls PIL would be): tests/e2e/test_script_verdicts.py sets it to make the input slow.
"""

import argparse
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=64, help="per replica")
parser.add_argument("--decode-ms", type=float, default=0.0)
parser.add_argument("--epochs", type=int, default=1000)
parser.add_argument("--steps-per-epoch", type=int, default=50)
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch = args.batch * strategy.num_replicas_in_sync


def decode(images, labels):
    time.sleep(args.decode_ms / 1000)  # the slow part of a real decoder
    return images, labels


def dataset():
    rng = tf.random.Generator.from_seed(7)
    images = rng.uniform((2048, 32, 32, 3))
    labels = tf.cast(tf.reduce_mean(images[:, :16], axis=[1, 2, 3]) > 0.5, tf.int64)
    ds = (
        tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(global_batch, drop_remainder=True)
    )
    if args.decode_ms:
        ds = ds.map(lambda x, y: tf.py_function(decode, [x, y], (tf.float32, tf.int64)))
        ds = ds.map(
            lambda x, y: (tf.ensure_shape(x, (global_batch, 32, 32, 3)), tf.ensure_shape(y, (global_batch,)))
        )
    return ds.prefetch(tf.data.AUTOTUNE)


class Progress(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        ms = (time.perf_counter() - self.start) * 1000 / args.steps_per_epoch
        print(f"epoch {epoch + 1}: loss {logs['loss']:.4f}, {ms:.0f} ms/step", flush=True)


with strategy.scope():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((32, 32, 3)),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(2),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(1e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )

model.fit(
    dataset(), epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, callbacks=[Progress()], verbose=0
)
