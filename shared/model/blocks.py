"""The pre-norm transformer block the ViT and the GPT share: its variables, with Megatron-style layouts on a
`model` axis, and its forward (layer norm, multi-head self-attention, layer norm, MLP with GELU, residuals).

Q, K, V and the first MLP weight are split on their output (heads, units), the attention output projection
and the second MLP weight on their input, so each block all-reduces its activations twice on a model axis,
as Megatron-LM does; the norms and the biases after a row-parallel weight are replicated.
"""

from typing import Callable, List

import tensorflow as tf

from dtensor_vs_mirrored.shared.model.definition import MODEL_AXIS, UNSHARDED, Variable, ones, zeros

LAYER_NORM_EPSILON = 1e-6
U, M = UNSHARDED, MODEL_AXIS


def layer_norm(x, scale, offset):
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    variance = tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + LAYER_NORM_EPSILON) * scale + offset


def block_variables(prefix: str, width: int, heads: int, mlp_units: int, weight: Callable) -> List[Variable]:
    """One block's variables under `prefix` ("blocks/0/"); `weight(name, shape, layout)` draws a weight."""
    head_dim = width // heads
    variables = [Variable(prefix + "norm1/scale", (width,), ones), Variable(prefix + "norm1/offset", (width,))]
    for name in ("query", "key", "value"):  # column parallel: each device computes its heads
        variables += [
            weight(f"{prefix}attention/{name}", (width, heads, head_dim), (U, M, U)),
            Variable(f"{prefix}attention/{name}_bias", (heads, head_dim), zeros, (M, U)),
        ]
    return variables + [
        weight(prefix + "attention/output", (heads, head_dim, width), (M, U, U)),  # row parallel
        Variable(prefix + "attention/output_bias", (width,)),
        Variable(prefix + "norm2/scale", (width,), ones),
        Variable(prefix + "norm2/offset", (width,)),
        weight(prefix + "mlp/w1", (width, mlp_units), (U, M)),
        Variable(prefix + "mlp/b1", (mlp_units,), zeros, (M,)),
        weight(prefix + "mlp/w2", (mlp_units, width), (M, U)),
        Variable(prefix + "mlp/b2", (width,)),
    ]


def attention(v, prefix, x, causal: bool = False):
    """Multi-head self-attention over x [N, P, width]; heads split on the model axis, summed by the output
    projection. `causal`: position p sees positions 0..p only."""
    q, k, values = (
        tf.einsum("npd,dhk->nphk", x, v[f"{prefix}{name}"]) + v[f"{prefix}{name}_bias"]
        for name in ("query", "key", "value")
    )
    head_dim = v[f"{prefix}query"].shape[-1]
    scores = tf.einsum("nphk,nqhk->nhpq", q, k) * (head_dim**-0.5)
    if causal:  # a large negative score above the diagonal: its softmax weight is 0
        length = tf.shape(x)[1]
        future = 1.0 - tf.linalg.band_part(tf.ones([length, length], scores.dtype), -1, 0)
        scores -= future * tf.constant(min(1e9, scores.dtype.max / 2), scores.dtype)  # float16's max is 65504
    context = tf.einsum("nhpq,nqhk->nphk", tf.nn.softmax(scores, axis=-1), values)
    return tf.einsum("nphk,hkd->npd", context, v[f"{prefix}output"]) + v[f"{prefix}output_bias"]


def block(v, prefix, x, context, causal: bool = False, dropout: float = 0.0):
    """x + dropout(attention(norm1(x))), then that + dropout(MLP(norm2(that))) (the second layer's bias added after
    the dropout); each part tapped under `prefix`
    ("blocks/0/norm1", ".../attention", ".../norm2", ".../mlp")."""
    tap = context.tap
    normed = tap(prefix + "norm1", layer_norm(x, v[prefix + "norm1/scale"], v[prefix + "norm1/offset"]))
    x = x + context.dropout(tap(prefix + "attention", attention(v, prefix + "attention/", normed, causal)), dropout)
    normed = tap(prefix + "norm2", layer_norm(x, v[prefix + "norm2/scale"], v[prefix + "norm2/offset"]))
    hidden = tf.nn.gelu(tf.matmul(normed, v[prefix + "mlp/w1"]) + v[prefix + "mlp/b1"])
    mlp = tap(prefix + "mlp", tf.matmul(hidden, v[prefix + "mlp/w2"]))  # the bias after: x + mlp + b2, as always
    return x + context.dropout(mlp, dropout) + v[prefix + "mlp/b2"]
