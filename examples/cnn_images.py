"""A model that is not MNIST's: a small CNN on 32x32 colour images, trained from your own .npz.

    python examples/write_images.py images.npz        # a deterministic set of images to try it on
    python compare.py --model examples/cnn_images.py:cnn --data images.npz
    python -m pytest -m "" examples/test_cnn_images.py

One example is an image [32, 32, 3] float32 with one label of 10 classes (`input_shape`, `label_shape`,
`classes`); the .npz holds x_train [N, 32, 32, 3], y_train [N], x_test and y_test. Two 3x3 convolutions
(16 and 32 channels, each with ReLU and a 2x2 max pool), then a dense layer of 128 units split over a
`model` axis (column then row parallel, as Megatron-LM does) and 10 logits.
"""

import tensorflow as tf

from dtensor_vs_mirrored.shared.model import MODEL_AXIS, UNSHARDED, ModelDefinition, Variable, truncated_normal, zeros

SIDE, COLOURS, CLASSES, UNITS = 32, 3, 10, 128
FLAT = 8 * 8 * 32  # after two 2x2 pools


def forward(variables, images):
    """images [N, 32, 32, 3] -> logits [N, 10]."""
    x = images
    for layer in ("conv1", "conv2"):
        x = tf.nn.relu(tf.nn.conv2d(x, variables[f"{layer}/w"], strides=1, padding="SAME") + variables[f"{layer}/b"])
        x = tf.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID")
    x = tf.nn.relu(tf.matmul(tf.reshape(x, [-1, FLAT]), variables["dense/w"]) + variables["dense/b"])
    return tf.matmul(x, variables["out/w"]) + variables["out/b"]


def cnn() -> ModelDefinition:
    variables = (
        Variable("conv1/w", (3, 3, COLOURS, 16), truncated_normal(0.2, stream=1)),
        Variable("conv1/b", (16,), zeros),
        Variable("conv2/w", (3, 3, 16, 32), truncated_normal(0.1, stream=2)),
        Variable("conv2/b", (32,), zeros),
        Variable("dense/w", (FLAT, UNITS), truncated_normal(0.02, stream=3), layout=(UNSHARDED, MODEL_AXIS)),
        Variable("dense/b", (UNITS,), zeros, layout=(MODEL_AXIS,)),
        Variable("out/w", (UNITS, CLASSES), truncated_normal(0.1, stream=4), layout=(MODEL_AXIS, UNSHARDED)),
        Variable("out/b", (CLASSES,), zeros),
    )
    multiply_adds = SIDE * SIDE * 9 * COLOURS * 16 + 16 * 16 * 9 * 16 * 32 + FLAT * UNITS + UNITS * CLASSES
    return ModelDefinition(
        name="cnn 32x32x3 conv16 conv32 dense128",
        variables=variables,
        forward=forward,
        flops_per_example=3 * 2 * multiply_adds,
        description="CNN on 32x32x3 images: two 3x3 convolutions (16, 32), dense 128",
        input_shape=(SIDE, SIDE, COLOURS),
        label_shape=(),
        classes=CLASSES,
    )
