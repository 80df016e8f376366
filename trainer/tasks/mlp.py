"""`mlp`: a two-hidden-layer perceptron on flat features. Tiny and fast: the tests' task."""

from __future__ import annotations

from trainer.tasks.spec import Problem, TaskSpec, register, sparse_ce

PROBLEM = Problem(input_shape=(32,), num_classes=4, num_examples=16384)


def model(problem, seed: int):
    import tensorflow as tf  # here, not at the top: the registry is read before TensorFlow loads

    def init():
        return tf.keras.initializers.GlorotUniform(seed=seed)

    return tf.keras.Sequential(
        [
            tf.keras.Input(problem.input_shape),
            tf.keras.layers.Dense(64, activation="relu", kernel_initializer=init()),
            tf.keras.layers.Dense(64, activation="relu", kernel_initializer=init()),
            tf.keras.layers.Dense(problem.num_classes, kernel_initializer=init()),
        ]
    )


SPEC = register(
    TaskSpec(
        name="mlp",
        summary="two 64-wide hidden layers on 32 features",
        problem=PROBLEM,
        model=model,
        loss=sparse_ce,
    )
)
