"""A batch's inputs, as every trainer handles them: one array [N, ...], or for a model of several named inputs a
dict {name: [N, ...]} (shared/model/named_inputs.py), each cut, stacked, padded and split on its first axis alike.
Each function takes either (tf.nest: an array is one leaf), NumPy arrays or tensors.
"""

from typing import Callable, Sequence

import numpy as np
import tensorflow as tf


def each(function: Callable, x):
    """`function` on every input array of x, in x's structure: an array, or a dict of them."""
    return tf.nest.map_structure(function, x)


def take(x, index):
    """The examples `index` (an index array or a slice) of every input."""
    return tf.nest.map_structure(lambda array: array[index], x)


def stacked(batches: Sequence):
    """Batches of equal shape stacked on a new leading steps axis, input by input."""
    return tf.nest.map_structure(lambda *arrays: np.stack(arrays), *batches)


def joined(batches: Sequence):
    """Batches concatenated on the examples' axis, input by input."""
    return tf.nest.map_structure(lambda *arrays: np.concatenate(arrays), *batches)


def first(x):
    """One input array of x (the first by name): every input has the same examples on its first axis."""
    return tf.nest.flatten(x)[0]


def flat(x) -> list:
    """Every input array of x, by name."""
    return tf.nest.flatten(x)
