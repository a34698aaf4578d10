"""Compiled Keras models that train their own objective (shared/model/keras_objective.py): a regression, a binary
classifier, an L2-regularized classifier, one with an activity regularizer, and their data (write_data)."""

import keras
import numpy as np

FEATURES = 8


def body(units: int, **hidden):
    inputs = keras.Input((FEATURES,))
    hidden_layer = keras.layers.Dense(16, activation="relu", name="hidden", **hidden)(inputs)
    return keras.Model(inputs, keras.layers.Dense(units, name="out")(hidden_layer))


def regression():
    model = body(1)
    model.compile(optimizer="adam", loss="mse")
    return model


def binary():
    model = body(1)
    model.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def regularized():
    model = body(3, kernel_regularizer=keras.regularizers.L2(0.1))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def activity():
    """A loss computed from the examples: Keras's activity regularizer, a mean over the batch's examples."""
    model = body(3, activity_regularizer=keras.regularizers.L2(0.1))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def cosine():
    model = body(1)
    model.compile(optimizer=keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(0.01, 100)), loss="mse")
    return model


def write_data(path: str, kind: str, train: int = 200, test: int = 64) -> str:
    """Features from a normal draw and targets from a fixed linear map: "values" floats [N], "binary" 0/1 ints [N],
    "classes" ids 0-2 [N]."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(train + test, FEATURES)).astype(np.float32)
    score = x @ rng.normal(size=FEATURES)
    y = {
        "values": (score + 0.1 * rng.normal(size=len(x))).astype(np.float32),
        "binary": (score > 0).astype(np.int64),
        "classes": np.digitize(score, [-1.0, 1.0]).astype(np.int64),
    }[kind]
    np.savez(path, x_train=x[:train], y_train=y[:train], x_test=x[train:], y_test=y[train:])
    return path


def clipped():
    """An optimizer setting the project's Adam has not (clipping before the all-reduce): set aside, and said."""
    model = body(1)
    model.compile(optimizer=keras.optimizers.Adam(1e-3, global_clipnorm=1.0), loss="mse")
    return model
