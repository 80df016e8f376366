"""A user's MultiWorkerMirroredStrategy `model.fit` script, written as users write it: a small CNN on
images made in a tf.data pipeline, a user callback timing each epoch. Nothing of this project is
imported.

    python fit_cnn.py [--model cifar|mnist] [--batch 64] [--epochs 1000] [--steps-per-epoch 50]
                      [--steps-per-execution 1] [--decode-ms 0] [--no-drop-remainder]
                      [--no-prefetch] [--verbose 0]

--model cifar: 32x32x3 images, three convolutions and a global average pooling (few weights, ~39 KB
all-reduced a step: compute dominates); mnist: 28x28x1 images, two convolutions and a dense layer on
the flattened maps (~1 MB of weights a step). --decode-ms stands for a slow decode step (a Python
function per batch, as a `tf.py_function` that opens files or calls PIL would be).
--no-drop-remainder leaves the batch's size unknown to the graph; --no-prefetch reads each batch
when the step asks for it.
"""

import argparse
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402

SHAPES = {"cifar": (32, 32, 3), "mnist": (28, 28, 1)}

parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=SHAPES, default="cifar")
parser.add_argument("--batch", type=int, default=64, help="per replica")
parser.add_argument("--epochs", type=int, default=1000)
parser.add_argument("--steps-per-epoch", type=int, default=50)
parser.add_argument("--steps-per-execution", type=int, default=1)
parser.add_argument("--decode-ms", type=float, default=0.0)
parser.add_argument("--drop-remainder", action=argparse.BooleanOptionalAction, default=True)
parser.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=True)
parser.add_argument("--verbose", type=int, default=0)
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch = args.batch * strategy.num_replicas_in_sync
shape = SHAPES[args.model]


def decode(images, labels):
    time.sleep(args.decode_ms / 1000)  # the slow part of a real decoder
    return images, labels


def dataset():
    rng = tf.random.Generator.from_seed(7)
    images = rng.uniform((2048, *shape))
    labels = tf.cast(tf.reduce_mean(images[:, :16], axis=[1, 2, 3]) > 0.5, tf.int64)
    ds = (
        tf.data.Dataset.from_tensor_slices((images, labels))
        .repeat()
        .batch(global_batch, drop_remainder=args.drop_remainder)
    )
    if args.decode_ms:
        ds = ds.map(lambda x, y: tf.py_function(decode, [x, y], (tf.float32, tf.int64)))
        ds = ds.map(
            lambda x, y: (tf.ensure_shape(x, (global_batch, *shape)), tf.ensure_shape(y, (global_batch,)))
        )
    return ds.prefetch(tf.data.AUTOTUNE) if args.prefetch else ds


def layers():
    if args.model == "mnist":
        return [
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Flatten(),
        ]
    return [
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
    ]


class PrintEpoch(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.start, self.cpu = time.perf_counter(), time.process_time()

    def on_epoch_end(self, epoch, logs=None):
        seconds, cpu = time.perf_counter() - self.start, time.process_time() - self.cpu
        print(f"epoch {epoch} done, loss {logs['loss']:.4f}, {seconds:.3f} s, {cpu:.3f} s CPU", flush=True)


with strategy.scope():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape),
            *layers(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(2),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(1e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=args.steps_per_execution,
    )

model.fit(
    dataset(),
    epochs=args.epochs,
    steps_per_epoch=args.steps_per_epoch,
    callbacks=[PrintEpoch()],
    verbose=args.verbose,
)
