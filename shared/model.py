"""The MLP: its layer sizes, its initial values, and a plain tf.Module version of it.

The tutorial meant 784 -> 700 (ReLU) -> 500 (ReLU) -> 10 (logits); it overwrites
`hidden_layer_2_size` with 10 and so builds 784-700-10-10. We build what it meant.

Initial values are drawn once, unsharded, exactly as the tutorial draws them, and
every trainer starts from these arrays: a stateless random op under a sharded
DTensor layout draws different values than the same op unsharded.
"""
from typing import Callable, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from shared.config import DTYPES
from shared.data import IMAGE_PIXELS, NUM_CLASSES
from shared.errors import UsageError


def layer_sizes(hidden: Sequence[int]) -> Tuple[int, ...]:
    return (IMAGE_PIXELS, *hidden, NUM_CLASSES)


def initial_values(sizes: Sequence[int], seed: int, dtype: str = "float32") -> List[np.ndarray]:
    """[w0, b0, w1, b1, ...]: Xavier-uniform weights with the tutorial's stateless draw, zero biases.

    Each layer draws `stateless_uniform((in, out), seed=(seed, seed + 1))` with
    limit sqrt(6) / sqrt(in + out), as the tutorial's DenseLayer does (seed 22 gives (22, 23)).
    The draw is always float32; `dtype` "float64" widens those numbers exactly, so both
    precisions train the same model from the same start.
    """
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r} is unknown; use {' or '.join(DTYPES)}")
    values = []
    with tf.device("/CPU:0"):
        for in_dim, out_dim in zip(sizes[:-1], sizes[1:]):
            limit = tf.sqrt(6.0) / tf.sqrt(tf.cast(in_dim + out_dim, tf.float32))
            weight = tf.random.stateless_uniform((in_dim, out_dim), seed=(seed, seed + 1),
                                                 minval=-limit, maxval=limit)
            values += [weight.numpy(), np.zeros(out_dim, np.float32)]
    return [value.astype(dtype) for value in values]


def parameter_count(sizes: Sequence[int]) -> int:
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


class DenseLayer(tf.Module):
    """y = activation(x @ w + b) with plain tf.Variables (MirroredVariables under a strategy scope)."""

    def __init__(self, weight, bias, activation: Callable = tf.identity, make_variable=tf.Variable):
        super().__init__()
        self.w = make_variable(weight, name="w")
        self.b = make_variable(bias, name="b")
        self.activation = activation

    def __call__(self, x):
        return self.activation(tf.matmul(x, self.w) + self.b)


class MLP(tf.Module):
    """Layers applied in order; ReLU on every layer but the last, which gives logits."""

    def __init__(self, layers):
        super().__init__()
        self.layers = layers

    def __call__(self, x):
        x = tf.cast(x, self.layers[0].w.dtype)  # float32 images into a float64 model: widened exactly, per batch
        for layer in self.layers:
            x = layer(x)
        return x

    @property
    def weights(self) -> list:
        """[w0, b0, w1, b1, ...], the order of `initial_values` (tf.Module sorts by name instead)."""
        return [v for layer in self.layers for v in (layer.w, layer.b)]


def build_mlp(values: Sequence[np.ndarray], make_variable=tf.Variable) -> MLP:
    """An MLP whose variables hold `values` ([w0, b0, ...]), made by `make_variable`."""
    count = len(values) // 2
    return MLP([DenseLayer(values[2 * i], values[2 * i + 1],
                           tf.nn.relu if i < count - 1 else tf.identity, make_variable)
                for i in range(count)])


def build_model_and_optimizer(config):
    """The MLP from the shared initial values and its optimizer, all as plain tf.Variables.

    Under `strategy.scope()` they become MirroredVariables; under `tf.device` they live there.
    (DTensor builds its own: its variables are DVariables with layouts.)
    """
    from shared.optim import make_optimizer
    model = build_mlp(initial_values(layer_sizes(config.hidden), config.seed, config.dtype))
    optimizer = make_optimizer(
        config.optimizer, config.adam, model.weights, config.learning_rate,
        zeros_like=lambda var: tf.Variable(tf.zeros_like(var)),
        make_step=lambda: tf.Variable(0, dtype=tf.int64))
    return model, optimizer
