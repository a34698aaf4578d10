"""An example of your own model for `compare.py --model`: copy this file and change it.

    python compare.py --model examples/my_model.py:my_model --data embedded
    python -m pytest -m "" examples/test_my_model.py

A model is a `ModelDefinition`: named variables (shape, initializer, DTensor layout on a mesh
with a `model` axis) and one pure forward of (variables by name, images [N, 784]) -> logits
[N, 10]. Every trainer calls the same forward: one device, MirroredStrategy, a DTensor mesh.
This one is a small CNN: a 5x5 convolution of 8 channels, ReLU, 2x2 max pool, then a dense
layer of 128 units split over the model axis (column then row parallel, as Megatron-LM does).
"""

import tensorflow as tf

from dtensor_vs_mirrored.shared.model.definition import (
    MODEL_AXIS,
    UNSHARDED,
    ModelDefinition,
    Variable,
    truncated_normal,
    zeros,
)

CHANNELS, UNITS = 8, 128
POOLED = 14 * 14 * CHANNELS  # 28x28 images, 2x2 pool


def forward(variables, images):
    x = tf.reshape(images, [-1, 28, 28, 1])
    x = tf.nn.relu(tf.nn.conv2d(x, variables["conv/w"], strides=1, padding="SAME") + variables["conv/b"])
    x = tf.reshape(tf.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID"), [-1, POOLED])
    x = tf.nn.relu(tf.matmul(x, variables["dense/w"]) + variables["dense/b"])
    return tf.matmul(x, variables["out/w"]) + variables["out/b"]


def my_model() -> ModelDefinition:
    variables = (
        Variable("conv/w", (5, 5, 1, CHANNELS), truncated_normal(0.2, stream=1)),  # replicated on every device
        Variable("conv/b", (CHANNELS,), zeros),
        # Split on the model axis: each device computes its slice of the 128 units...
        Variable("dense/w", (POOLED, "units"), truncated_normal(0.03, stream=2), layout=(UNSHARDED, MODEL_AXIS)),
        Variable("dense/b", ("units",), zeros, layout=(MODEL_AXIS,)),
        # ...and contracts it here; DTensor sums the slices with one all-reduce.
        Variable("out/w", ("units", 10), truncated_normal(0.1, stream=3), layout=(MODEL_AXIS, UNSHARDED)),
        Variable("out/b", (10,), zeros),
    )
    multiply_adds = 28 * 28 * 5 * 5 * CHANNELS + POOLED * UNITS + UNITS * 10
    return ModelDefinition(
        name=f"cnn conv5x5x{CHANNELS} dense {UNITS}",
        variables=variables,
        forward=forward,
        flops_per_example=3 * 2 * multiply_adds,
        # "units" may be padded with zero units when a model axis does not divide 128 (e.g. 3):
        # a zero unit's ReLU is 0 with gradient 0, so it stays 0 and the function is unchanged.
        sizes={"units": UNITS},
        paddable=frozenset({"units"}),
        description=f"CNN: 5x5 conv of {CHANNELS} channels, 2x2 max pool, dense {UNITS}",
    )
