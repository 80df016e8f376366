"""A user's MultiWorkerMirroredStrategy custom training loop, written as users write it.

Nothing of this project is imported. Knobs: STEPS, BATCH, DISTRIBUTE=function|dataset
(distribute_datasets_from_function or experimental_distribute_dataset), RETURN_LOSS=1|0.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
per_replica = int(os.environ.get("BATCH", "32"))
global_batch = per_replica * strategy.num_replicas_in_sync
steps = int(os.environ.get("STEPS", "200"))
return_loss = os.environ.get("RETURN_LOSS", "1") == "1"


def examples(batch):
    rng = tf.random.Generator.from_seed(2)
    x = rng.normal((2048, 64))
    y = tf.reduce_sum(x[:, :8], axis=1, keepdims=True)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)


def dataset_fn(context):
    batch = context.get_per_replica_batch_size(global_batch)
    return examples(batch).shard(context.num_input_pipelines, context.input_pipeline_id).prefetch(2)


if os.environ.get("DISTRIBUTE", "function") == "function":
    dist = strategy.distribute_datasets_from_function(dataset_fn)
else:
    dist = strategy.experimental_distribute_dataset(examples(global_batch))

with strategy.scope():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((64,)),
            tf.keras.layers.Dense(256, activation="relu"),
            tf.keras.layers.Dense(256, activation="relu"),
            tf.keras.layers.Dense(1),
        ]
    )
    optimizer = tf.keras.optimizers.SGD(0.01)


def replica_step(x, y):
    with tf.GradientTape() as tape:
        pred = model(x, training=True)
        loss = tf.nn.compute_average_loss(tf.square(pred - y), global_batch_size=global_batch)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def train_step(iterator):
    per_replica_loss = strategy.run(replica_step, args=next(iterator))
    loss = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)
    return loss if return_loss else None


iterator = iter(dist)
for step in range(steps):
    loss = train_step(iterator)
    if step % 50 == 0 and loss is not None:
        print(f"step {step} loss {float(loss):.4f}", flush=True)
print("done", int(optimizer.iterations.numpy()), flush=True)
