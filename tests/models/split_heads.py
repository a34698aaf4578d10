"""Models whose output layer is split on a mesh's `model` axis (a column-parallel head), for
tests/test_split_classes.py: their logits come out split on the class dimension, where DTensor's softmax
cross-entropy returns 0.0 unless the trainer gathers the classes first (dtensor_impl/classes.py).

- `keras_column_head`: a Keras MLP whose LayoutMap gives `out/kernel` `(None, "model")`; `keras_column_head_12`
  the same with 12 logits (10 digits and 2 never labelled), so that a model axis of 4 divides them.
- `mlp_column_head`: the built-in MLP (shared/model/mlp.py), its output layer laid out column-parallel.
- `own_loss_column_head`: the same with a loss of its own (label smoothing, through the same op).
"""

import dataclasses

import tensorflow as tf

from dtensor_vs_mirrored.shared.model.definition import MODEL_AXIS, UNSHARDED
from dtensor_vs_mirrored.shared.model.mlp import mlp

HIDDEN = 16


def keras_column_head(units: int = 10):
    import keras

    inputs = keras.Input((784,))
    hidden = keras.layers.Dense(HIDDEN, activation="relu", name="hidden")(inputs)
    logits = keras.layers.Dense(units, name="out")(hidden)
    layout_map = keras.distribution.LayoutMap(None)
    layout_map["out/kernel"] = (None, "model")
    layout_map["out/bias"] = ("model",)
    return keras.Model(inputs, logits, name="column_head"), layout_map


def keras_column_head_12():
    return keras_column_head(units=12)


def mlp_column_head(**changes):
    """The built-in MLP of one hidden layer, its output layer's weight and bias split on `model`."""
    definition = mlp(hidden=(HIDDEN,))
    head = {"layers/1/w": (UNSHARDED, MODEL_AXIS), "layers/1/b": (MODEL_AXIS,)}
    variables = tuple(
        dataclasses.replace(variable, layout=head.get(variable.name, variable.layout))
        for variable in definition.variables
    )
    return dataclasses.replace(definition, **{"name": "mlp column head", "variables": variables, **changes})


SMOOTHING = 0.1


def smoothed_cross_entropy(logits, labels):
    """Label smoothing: (1 - SMOOTHING) x the label's cross-entropy + SMOOTHING x the mean over the classes'."""
    every_class = -tf.reduce_mean(tf.nn.log_softmax(logits, axis=-1), axis=-1)
    label = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return (1 - SMOOTHING) * label + SMOOTHING * every_class


def own_loss_column_head():
    return mlp_column_head(name="mlp column head, own loss", loss=smoothed_cross_entropy)
