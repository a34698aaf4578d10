"""Models whose forward draws its own random numbers, as a new user's first dropout would: with tf.nn.dropout
(stateful: DTensor refuses it) and with a mask from tf.random.stateless_uniform (each device draws its own
slice). tests/test_randomness.py checks that the tool names the op and points to context.dropout."""

import tensorflow as tf

from dtensor_vs_mirrored.shared.model.definition import ModelDefinition, Variable, truncated_normal, zeros

UNITS = 32
RATE = 0.5


def dense_dropout_dense(drop):
    def forward(variables, images, context):
        x = context.tap("dense", tf.matmul(images, variables["dense/w"]) + variables["dense/b"])
        x = context.tap("dropout", drop(tf.nn.relu(x)) if context.training else tf.nn.relu(x))
        return context.tap("out", tf.matmul(x, variables["out/w"]) + variables["out/b"])

    return ModelDefinition(
        name=f"mlp 784-{UNITS}-10 with its own dropout",
        variables=(
            Variable("dense/w", (784, UNITS), truncated_normal(0.05, stream=1)),
            Variable("dense/b", (UNITS,), zeros),
            Variable("out/w", (UNITS, 10), truncated_normal(0.1, stream=2)),
            Variable("out/b", (10,), zeros),
        ),
        forward=forward,
        flops_per_example=3 * 2 * (784 * UNITS + UNITS * 10),
    )


def stateful() -> ModelDefinition:
    return dense_dropout_dense(lambda x: tf.nn.dropout(x, RATE, seed=1))


def stateless() -> ModelDefinition:
    def drop(x):
        keep = tf.random.stateless_uniform(tf.shape(x), seed=(1, 2), dtype=x.dtype) >= RATE
        return tf.where(keep, x / (1 - RATE), tf.zeros_like(x))

    return dense_dropout_dense(drop)


def with_helper() -> ModelDefinition:
    """The same model, its dropout drawn by context.dropout: every trainer draws alike."""

    def forward(variables, images, context):
        x = context.tap("dense", tf.matmul(images, variables["dense/w"]) + variables["dense/b"])
        x = context.tap("dropout", context.dropout(tf.nn.relu(x), RATE))
        return context.tap("out", tf.matmul(x, variables["out/w"]) + variables["out/b"])

    definition = stateless()
    return ModelDefinition(
        name=definition.name.replace("its own", "context's"),
        variables=definition.variables,
        forward=forward,
        flops_per_example=definition.flops_per_example,
    )
