"""`cnn`: a small ResNet (strided stems, residual blocks with BatchNorm, a linear head) on 16x16 images."""

from __future__ import annotations

from trainer.tasks.spec import Problem, TaskSpec, register, sparse_ce

PROBLEM = Problem(input_shape=(16, 16, 3), num_classes=10, num_examples=16384, pool=2)


def model(problem, seed: int):
    import tensorflow as tf  # here, not at the top: the registry is read before TensorFlow loads

    layers = tf.keras.layers

    def init():
        return tf.keras.initializers.HeNormal(seed=seed)

    def block(x, filters):
        y = layers.Conv2D(filters, 3, padding="same", use_bias=False, kernel_initializer=init())(x)
        y = layers.ReLU()(layers.BatchNormalization()(y))
        y = layers.Conv2D(filters, 3, padding="same", use_bias=False, kernel_initializer=init())(y)
        return layers.ReLU()(layers.Add()([x, layers.BatchNormalization()(y)]))

    inputs = tf.keras.Input(problem.input_shape)
    x = layers.Conv2D(16, 3, strides=2, padding="same", kernel_initializer=init())(inputs)
    x = block(x, 16)
    x = layers.Conv2D(32, 3, strides=2, padding="same", kernel_initializer=init())(x)
    x = block(x, 32)
    head = layers.Dense(problem.num_classes, kernel_initializer=tf.keras.initializers.GlorotUniform(seed))
    return tf.keras.Model(inputs, head(layers.Flatten()(x)), name="resnet_small")


SPEC = register(
    TaskSpec(
        name="cnn",
        summary="a small ResNet on 16x16x3 images, 10 classes from a teacher on 2x2-pooled pixels",
        problem=PROBLEM,
        model=model,
        loss=sparse_ce,
    )
)
