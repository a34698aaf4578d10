"""Keras models whose LayoutMaps the audit reads (tests/test_keras_layouts.py): `--model
tests/models/keras_layouts.py:NAME`. Each map is built with `keras.distribution.LayoutMap(None)`: no device mesh.

`audited`: 784 -> hidden 64 -> block_dense 32 -> out 10 (52,650 parameters), with a key that matches
(hidden/kernel, hidden/bias), one written for Keras 3.13's re.search ('dense.*kernel': only re.search matches
block_dense/kernel, so under re.fullmatch its 2,048-parameter kernel stays replicated) and one for a layer the
model lacks ('experts/.*').
"""

import keras


def audited():
    inputs = keras.Input((784,))
    hidden = keras.layers.Dense(64, activation="relu", name="hidden")(inputs)
    block = keras.layers.Dense(32, activation="relu", name="block_dense")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(10, name="out")(block))
    layout_map = keras.distribution.LayoutMap(None)
    layout_map["hidden/kernel"] = (None, "model")
    layout_map["hidden/bias"] = ("model",)
    layout_map["dense.*kernel"] = ("model", None)
    layout_map["experts/.*"] = (None, "model")
    return model, layout_map


def indivisible_by_pattern():
    """out/kernel's 10 logits split by a pattern key over a model axis of 4: refused naming the key."""
    inputs = keras.Input((784,))
    model = keras.Model(inputs, keras.layers.Dense(10, name="out")(inputs))
    layout_map = keras.distribution.LayoutMap(None)
    layout_map["out/k.*"] = (None, "model")
    return model, layout_map


def char_lm():
    """docs/keras.md's language model of tiny Shakespeare's 65 characters, 64 a window: its MLP split Megatron-style,
    the embedding left whole (24.7% of the parameters: the header names it)."""
    tokens = keras.Input((64,), dtype="int32")
    hidden = keras.layers.Embedding(65, 32, name="embed")(tokens)
    hidden = keras.layers.Dense(64, activation="relu", name="mlp")(hidden)
    model = keras.Model(tokens, keras.layers.Dense(65, name="logits")(hidden))
    layout_map = keras.distribution.LayoutMap(None)
    layout_map["mlp/kernel"] = (None, "model")
    layout_map["mlp/bias"] = ("model",)
    layout_map["logits/kernel"] = ("model", None)
    return model, layout_map


def bad_regex():
    """A key with an unbalanced bracket: Keras's own lookup raised re.error from inside it."""
    inputs = keras.Input((784,))
    model = keras.Model(inputs, keras.layers.Dense(10, name="out")(inputs))
    layout_map = keras.distribution.LayoutMap(None)
    layout_map["out/kernel[0"] = (None, "model")
    return model, layout_map
