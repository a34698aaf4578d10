"""A forward that DTensor's SPMD expansion cannot compute with its weights split on the batch axis, for
tests/test_sharding.py: with `--shard-weights --sharded-forward expand` the trainer fails in one line, and `auto`
all-gathers the weights with DTensor's error as the reason (`--model tests/models/unexpandable.py:arg_max_mlp`).

The arg-max over the hidden layer's units comes out of DTensor's expansion at half the batch (`Expected shape: <128>
got shape: <64>`, TensorFlow 2.21, `batch=2`): every model met this in the accuracy's arg-max over its logits until
the trainer relaid them out to the classes whole (dtensor_impl/classes.py); here it is the forward's own.
"""

import tensorflow as tf

from dtensor_vs_mirrored.shared.model.definition import ModelDefinition, Variable, truncated_normal, zeros

HIDDEN = 32


def forward(v, images):
    hidden = tf.matmul(images, v["w1"]) + v["b1"]
    strongest = tf.cast(tf.argmax(hidden, axis=-1), hidden.dtype)  # which unit is strongest, as one more input
    hidden = tf.nn.relu(hidden) + tf.expand_dims(strongest, -1)
    return tf.matmul(hidden, v["w2"]) + v["b2"]


def arg_max_mlp() -> ModelDefinition:
    variables = (
        Variable("w1", (784, HIDDEN), truncated_normal(0.05, 1)),
        Variable("b1", (HIDDEN,), zeros),
        Variable("w2", (HIDDEN, 10), truncated_normal(0.1, 2)),
        Variable("b2", (10,), zeros),
    )
    return ModelDefinition(
        name="arg-max mlp",
        variables=variables,
        forward=forward,
        flops_per_example=6 * (784 * HIDDEN + HIDDEN * 10),
        independent_examples=True,
    )
