"""A team's custom training loop, as users write it: MultiWorkerMirroredStrategy, `strategy.run` in a
`tf.function`, `distribute_datasets_from_function`, a wide MLP (its gradients are what the network
carries). Nothing of this project is imported.

    python custom_loop_mlp.py [--batch 2048] [--steps 100000000]
"""

import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=2048, help="per replica")
parser.add_argument("--steps", type=int, default=100_000_000)
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch = args.batch * strategy.num_replicas_in_sync


def dataset_fn(context):
    rng = tf.random.Generator.from_seed(3)
    x = rng.normal((4096, 128))
    y = tf.reduce_sum(x[:, :8], axis=1, keepdims=True)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
    return ds.batch(context.get_per_replica_batch_size(global_batch), drop_remainder=True).prefetch(2)


with strategy.scope():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((128,)),
            tf.keras.layers.Dense(512, activation="relu"),
            tf.keras.layers.Dense(512, activation="relu"),
            tf.keras.layers.Dense(1),
        ]
    )
    optimizer = tf.keras.optimizers.SGD(0.01)


def replica_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(
            tf.square(model(x, training=True) - y), global_batch_size=global_batch
        )
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def train_step(iterator):
    losses = strategy.run(replica_step, args=next(iterator))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
for step in range(args.steps):
    loss = train_step(iterator)
    if step % 200 == 0:
        print(f"step {step}: loss {float(loss):.4f}", flush=True)
