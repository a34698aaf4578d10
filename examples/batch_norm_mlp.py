"""A model whose forward normalises over the batch: where DTensor and MirroredStrategy part ways.

    python compare.py --model examples/batch_norm_mlp.py:batch_norm_mlp --data embedded

784 -> 128 -> batch normalisation (the mean and variance of each unit over the examples of the
batch, then a learned scale and offset) -> ReLU -> 10. The statistics are the batch's own, in
training and in evaluation alike (no moving averages: the forward stays a pure function).

On one device the batch is the global batch of 128. On a DTensor mesh the activations are one
tensor sharded on the batch axis, so `reduce_mean(axis=0)` is a global mean (DTensor all-reduces
it): the same numbers as one device. Under MirroredStrategy each replica runs the forward on its
own piece, so it normalises its 16 examples on their own: another function, a MISMATCH from
step 0 (docs/parity.md, "Batch statistics"). A DTensor batch padded with zero-weight examples
(a last batch that does not divide over the batch axis) would count the padding in its statistics.
"""

import tensorflow as tf

from shared.model.definition import ModelDefinition, Variable, ones, truncated_normal, zeros

UNITS = 128
EPSILON = 1e-3


def forward(variables, images):
    x = tf.matmul(images, variables["dense/w"]) + variables["dense/b"]
    mean = tf.reduce_mean(x, axis=0)  # over the batch: the global batch on DTensor, a replica's piece on Mirrored
    variance = tf.reduce_mean(tf.square(x - mean), axis=0)
    x = (x - mean) * tf.math.rsqrt(variance + EPSILON) * variables["norm/scale"] + variables["norm/offset"]
    return tf.matmul(tf.nn.relu(x), variables["out/w"]) + variables["out/b"]


def batch_norm_mlp() -> ModelDefinition:
    variables = (
        Variable("dense/w", (784, UNITS), truncated_normal(0.05, stream=1)),
        Variable("dense/b", (UNITS,), zeros),
        Variable("norm/scale", (UNITS,), ones),
        Variable("norm/offset", (UNITS,), zeros),
        Variable("out/w", (UNITS, 10), truncated_normal(0.1, stream=2)),
        Variable("out/b", (10,), zeros),
    )
    return ModelDefinition(
        name=f"batch-norm mlp 784-{UNITS}-10",
        variables=variables,
        forward=forward,
        flops_per_example=3 * 2 * (784 * UNITS + UNITS * 10),
        description=f"MLP 784-{UNITS}-10 with batch normalisation",
    )
