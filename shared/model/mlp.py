"""The tutorial's MLP as a model definition: 784 -> 700 (ReLU) -> 500 (ReLU) -> 10 logits.

The tutorial meant 784-700-500-10; it overwrites `hidden_layer_2_size` with 10 and so builds
784-700-10-10. We build what it meant. Each weight is drawn as the tutorial's DenseLayer
draws it, `stateless_uniform((in, out), seed=(seed, seed + 1))` within sqrt(6 / (in + out)),
the same seed for every layer (22 gives (22, 23)); biases are zero.

Layouts on a mesh with a `model` axis, as in the "Distributed training with DTensors" tutorial
(Megatron's column- then row-parallel pairs): an even hidden layer's weight [unsharded, model]
and bias [model] (each device computes a slice of the features), an odd one's weight
[model, unsharded] (each contracts its slice; one all-reduce sums them), the output layer
replicated. A width the model axis does not divide gets zero units (700 over 8 becomes 704):
their ReLU output is 0, their gradients are 0, so Adam and SGD leave them at 0.
"""

import functools
import re
from typing import Sequence, Tuple

import tensorflow as tf

from dtensor_vs_mirrored.shared.config import TUTORIAL_HIDDEN
from dtensor_vs_mirrored.shared.model.definition import (
    MODEL_AXIS,
    UNSHARDED,
    ModelDefinition,
    Variable,
    summarise_named_state,
    zeros,
)
from dtensor_vs_mirrored.shared.model.mnist import IMAGE_PIXELS, NUM_CLASSES


def layer_sizes(hidden: Sequence[int]) -> Tuple[int, ...]:
    return (IMAGE_PIXELS, *hidden, NUM_CLASSES)


def xavier_uniform(shape, seed):
    """The tutorial's draw: every layer from seed (seed, seed + 1)."""
    in_dim, out_dim = shape
    with tf.device("/CPU:0"):
        limit = tf.sqrt(6.0) / tf.sqrt(tf.cast(in_dim + out_dim, tf.float32))
        return tf.random.stateless_uniform(shape, seed=(seed, seed + 1), minval=-limit, maxval=limit).numpy()


def forward(variables, images, context, dropout: float = 0.0):
    """ReLU (then dropout in training) on every layer but the last, which gives logits; each layer tapped."""
    count = len(variables) // 2
    x = images
    for i in range(count):
        x = context.tap(f"layers/{i}", tf.matmul(x, variables[f"layers/{i}/w"]) + variables[f"layers/{i}/b"])
        if i < count - 1:
            x = context.dropout(tf.nn.relu(x), dropout)
    return x


def layouts(layer: int, count: int):
    """(weight, bias) layouts of dense layer `layer` of `count` on a mesh with a model axis."""
    if layer == count - 1:
        return (), ()  # the output layer: replicated
    if layer % 2 == 0:
        return (UNSHARDED, MODEL_AXIS), (MODEL_AXIS,)  # column parallel: a slice of the outputs
    return (MODEL_AXIS, UNSHARDED), ()  # row parallel: contracts its slice, then an all-reduce


def mlp(hidden: Sequence[int] = TUTORIAL_HIDDEN, dropout: float = 0.0) -> ModelDefinition:
    sizes = layer_sizes(hidden)
    widths = [sizes[0]] + [f"hidden{i}" for i in range(1, len(sizes) - 1)] + [sizes[-1]]
    count = len(sizes) - 1
    variables = []
    for i in range(count):
        weight_layout, bias_layout = layouts(i, count)
        variables += [
            Variable(
                f"layers/{i}/w", (widths[i], widths[i + 1]), xavier_uniform, weight_layout, label=f"layer {i} weight"
            ),
            Variable(f"layers/{i}/b", (widths[i + 1],), zeros, bias_layout, label=f"layer {i} bias"),
        ]
    named = {f"hidden{i}": size for i, size in enumerate(hidden, start=1)}
    return ModelDefinition(
        independent_examples=True,
        name="mlp " + "-".join(map(str, sizes)),
        variables=tuple(variables),
        forward=functools.partial(forward, dropout=dropout) if dropout else forward,
        # 3 x 2 x weights: one multiply-add per weight forward, two backward (biases, activations, the
        # loss and Adam not counted; the first layer's input gradient, which nobody computes, is).
        flops_per_example=3 * 2 * sum(a * b for a, b in zip(sizes[:-1], sizes[1:])),
        sizes=named,
        paddable=frozenset(named),
        description="MLP " + "-".join(map(str, sizes)) + (f", dropout {dropout}" if dropout else ""),
        summarise_state=summarise_state,
    )


LAYER_LABEL = re.compile(r"^layer \d+ (weight|bias)( Adam [mv])?$")  # the labels `mlp` gives its variables


def summarise_state(names: Sequence[str], all_names: Sequence[str]) -> str:
    """State names, grouped: "every weight, bias and Adam slot", "every weight and bias, every Adam m",
    "every weight, layer 0, 1 bias Adam v"."""
    if not all(LAYER_LABEL.match(name) for name in all_names):
        return summarise_named_state(names, all_names)
    if all_names and set(names) == set(all_names):
        return "every weight, bias" + (" and Adam slot" if any("Adam" in name for name in all_names) else "")
    layer_count = len({name.split(" ", 2)[1] for name in all_names})
    groups = []
    for label, members, everything in (
        ("every weight and bias", [n for n in names if "Adam" not in n], [n for n in all_names if "Adam" not in n]),
        ("every Adam slot", [n for n in names if "Adam" in n], [n for n in all_names if "Adam" in n]),
    ):
        if members and set(members) == set(everything):
            groups.append(label)
            continue
        kinds = {}  # "weight Adam m" -> [layer indices], in the order of `names`
        for name in members:
            _, layer, kind = name.split(" ", 2)
            kinds.setdefault(kind, []).append(layer)
        groups += [
            f"every {kind}" if len(layers) == layer_count else f"layer {', '.join(layers)} {kind}"
            for kind, layers in kinds.items()
        ]
    return ", ".join(groups)


def parameter_count(sizes: Sequence[int]) -> int:
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
