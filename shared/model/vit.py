"""A small Vision Transformer on the same 28x28 images, with Megatron-style tensor-parallel layouts.

16 patches of 7x7 pixels, width 64, 8 heads of 8, 2 pre-norm blocks (layer norm, attention,
layer norm, MLP of 128 with GELU, residuals), a final layer norm, mean pool, 10 classes:
72k parameters. On a mesh with a `model` axis the heads and the MLP's hidden units are split:
Q, K, V and the first MLP weight on their output (heads, units), the attention output projection
and the second MLP weight on their input, so each block all-reduces its activations twice, as
Megatron-LM does; everything else is replicated. 8 heads and 128 units divide over a model axis
of 1, 2, 4 or 8; other axes are refused (no padding: a zero head is not free to add).
"""

import functools

import tensorflow as tf

from dtensor_vs_mirrored.shared.model.blocks import block, block_variables, layer_norm
from dtensor_vs_mirrored.shared.model.definition import ModelDefinition, Variable, ones, truncated_normal
from dtensor_vs_mirrored.shared.model.mnist import IMAGE_PIXELS, NUM_CLASSES

IMAGE_SIDE, PATCH_SIDE = 28, 7
GRID = IMAGE_SIDE // PATCH_SIDE  # 4 x 4 patches
PATCHES, PATCH_PIXELS = GRID * GRID, PATCH_SIDE * PATCH_SIDE
WIDTH, HEADS, MLP_UNITS, BLOCKS = 64, 8, 128, 2
HEAD_DIM = WIDTH // HEADS
INIT_STDDEV = 0.02  # ViT's truncated normal for weights and position embeddings


def patches(images):
    """[N, 784] -> [N, 16, 49]: row-major 7x7 patches, row-major within each."""
    x = tf.reshape(images, [-1, GRID, PATCH_SIDE, GRID, PATCH_SIDE])
    return tf.reshape(tf.transpose(x, [0, 1, 3, 2, 4]), [-1, PATCHES, PATCH_PIXELS])


def forward(v, images, context, dropout: float = 0.0):
    x = tf.einsum("npi,id->npd", patches(images), v["patch/w"]) + v["patch/b"] + v["position"]
    x = context.dropout(context.tap("embedding", x), dropout)
    for index in range(BLOCKS):
        x = block(v, f"blocks/{index}/", x, context, dropout=dropout)
    pooled = tf.reduce_mean(context.tap("norm", layer_norm(x, v["norm/scale"], v["norm/offset"])), axis=1)
    return context.tap("head", tf.matmul(pooled, v["head/w"]) + v["head/b"])


def flops_per_example() -> int:
    """Forward matmuls and einsums x 3 (forward + backward); norms, softmax and GELU not counted."""
    per_block = (
        3 * PATCHES * WIDTH * WIDTH  # Q, K, V
        + 2 * HEADS * PATCHES * PATCHES * HEAD_DIM  # scores, context
        + PATCHES * WIDTH * WIDTH  # output projection
        + 2 * PATCHES * WIDTH * MLP_UNITS
    )  # the MLP
    multiply_adds = PATCHES * PATCH_PIXELS * WIDTH + BLOCKS * per_block + WIDTH * NUM_CLASSES
    return 3 * 2 * multiply_adds


def vit(dropout: float = 0.0) -> ModelDefinition:
    streams = iter(range(1, 1000))  # one random stream per drawn variable: (seed, 1), (seed, 2), ...

    def weight(name, shape, layout=()):
        return Variable(name, shape, truncated_normal(INIT_STDDEV, next(streams)), layout)

    variables = [
        weight("patch/w", (PATCH_PIXELS, WIDTH)),
        Variable("patch/b", (WIDTH,)),
        weight("position", (PATCHES, WIDTH)),
    ]
    for index in range(BLOCKS):
        variables += block_variables(f"blocks/{index}/", WIDTH, HEADS, MLP_UNITS, weight)
    variables += [
        Variable("norm/scale", (WIDTH,), ones),
        Variable("norm/offset", (WIDTH,)),
        weight("head/w", (WIDTH, NUM_CLASSES)),
        Variable("head/b", (NUM_CLASSES,)),
    ]
    assert PATCHES * PATCH_PIXELS == IMAGE_PIXELS
    return ModelDefinition(
        independent_examples=True,
        name=f"vit patches {PATCHES}x{PATCH_PIXELS} width {WIDTH} heads {HEADS} mlp {MLP_UNITS} blocks {BLOCKS}",
        variables=tuple(variables),
        forward=functools.partial(forward, dropout=dropout),
        flops_per_example=flops_per_example(),
        description=f"ViT {PATCHES} patches of {PATCH_SIDE}x{PATCH_SIDE}, width {WIDTH}, {HEADS} heads, "
        f"MLP {MLP_UNITS}, {BLOCKS} blocks" + (f", dropout {dropout}" if dropout else ""),
    )
