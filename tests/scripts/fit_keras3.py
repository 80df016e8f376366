"""A user's `model.fit` script written as keras.io teaches it: `import keras` (Keras 3's spelling),
`keras.Sequential`, `model.fit` on a tf.data dataset under `strategy.scope()`, a callback printing each
epoch's loss. Nothing of this project is imported, and TF_USE_LEGACY_KERAS is never set.

    python fit_keras3.py [--batch 32] [--epochs 5] [--steps-per-epoch 20]

Under the SCRIPT= wrapper `import keras` trains with tf-keras (docs/script.md, "Keras 3 scripts").
"""

import argparse

import keras
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=32, help="per replica")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--steps-per-epoch", type=int, default=20)
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch = args.batch * strategy.num_replicas_in_sync

rng = tf.random.Generator.from_seed(7)
features = rng.normal((4096, 16))
targets = tf.reduce_sum(features[:, :4], axis=1, keepdims=True) - features[:, 4:5]
dataset = (
    tf.data.Dataset.from_tensor_slices((features, targets))
    .repeat()
    .batch(global_batch, drop_remainder=True)
    .prefetch(tf.data.AUTOTUNE)
)


class PrintLoss(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(f"epoch {epoch} loss {logs['loss']:.6f}", flush=True)


with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input(shape=(16,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-2), loss="mse", metrics=["mae"])

model.fit(
    dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, callbacks=[PrintLoss()], verbose=0
)
