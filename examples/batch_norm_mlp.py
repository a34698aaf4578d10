"""A model with batch normalisation and its running statistics: where DTensor and MirroredStrategy part ways.

    python compare.py --model examples/batch_norm_mlp.py:batch_norm_mlp --data embedded

784 -> 128 -> batch normalisation -> ReLU -> 10. In training it normalises each unit with the batch's mean and
variance and moves its running statistics toward them (momentum 0.9), non-trainable variables the forward updates
through `context.update`; evaluation and the export normalise with the running statistics.

On a DTensor mesh the activations are one tensor sharded on the batch axis, so `reduce_mean(axis=0)` is a global
mean (DTensor all-reduces it): one device's numbers, the running statistics updated once. Under MirroredStrategy
each replica normalises its own piece on its own: another function, a MISMATCH from step 0 whose first difference
is the `norm` tap (`dense` agrees), and each replica moves its own copy of the statistics (ON_READ, MEAN), as
Keras's BatchNormalization does (docs/models.md, "Batch statistics: where the approaches differ"). Padding would
count in the statistics, so `independent_examples` stays off: a short last batch is not padded to full shape.
"""

import tensorflow as tf

from dtensor_vs_mirrored.shared.model.definition import ModelDefinition, Variable, ones, truncated_normal, zeros

UNITS = 128
EPSILON = 1e-3
MOMENTUM = 0.9  # running = MOMENTUM * running + (1 - MOMENTUM) * the batch's


def forward(variables, images, context):
    x = context.tap("dense", tf.matmul(images, variables["dense/w"]) + variables["dense/b"])
    if context.training:  # the batch's statistics: the global batch on DTensor, a replica's piece on Mirrored
        mean = tf.reduce_mean(x, axis=0)
        variance = tf.reduce_mean(tf.square(x - mean), axis=0)
        for name, value in (("mean", mean), ("variance", variance)):
            running = variables[f"norm/moving_{name}"]
            context.update(f"norm/moving_{name}", MOMENTUM * running + (1 - MOMENTUM) * value)
    else:  # evaluation and serving: the running statistics
        mean, variance = variables["norm/moving_mean"], variables["norm/moving_variance"]
    x = (x - mean) * tf.math.rsqrt(variance + EPSILON) * variables["norm/scale"] + variables["norm/offset"]
    x = context.tap("norm", x)
    return context.tap("out", tf.matmul(tf.nn.relu(x), variables["out/w"]) + variables["out/b"])


def batch_norm_mlp() -> ModelDefinition:
    variables = (
        Variable("dense/w", (784, UNITS), truncated_normal(0.05, stream=1)),
        Variable("dense/b", (UNITS,), zeros),
        Variable("norm/scale", (UNITS,), ones),
        Variable("norm/offset", (UNITS,), zeros),
        Variable("norm/moving_mean", (UNITS,), zeros, trainable=False),
        Variable("norm/moving_variance", (UNITS,), ones, trainable=False),
        Variable("out/w", (UNITS, 10), truncated_normal(0.1, stream=2)),
        Variable("out/b", (10,), zeros),
    )
    return ModelDefinition(
        name=f"batch-norm mlp 784-{UNITS}-10",
        variables=variables,
        forward=forward,
        flops_per_example=3 * 2 * (784 * UNITS + UNITS * 10),
        description=f"MLP 784-{UNITS}-10 with batch normalisation and running statistics",
    )
