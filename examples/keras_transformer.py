"""A Keras Transformer block with its LayoutMap: MNIST's 28 rows as 28 tokens, MultiHeadAttention and a GELU MLP
split Megatron-style over a mesh's `model` axis by a keras.distribution.LayoutMap.

    python compare.py --model examples/keras_transformer.py:transformer --data embedded --devices 8 \\
        --mesh batch=2,model=4 --dtype float64
    python -m pytest -m "" examples/test_keras_transformer.py

Query, key and value split on their 4 heads, the attention output on its input heads, the MLP's 64 units on
the first layer's output and the second's input: each block all-reduces its activations twice, as Megatron-LM
does. 4 heads and 64 units divide over a model axis of 1, 2 and 4.
"""

import keras

ROWS, WIDTH, HEADS, UNITS, CLASSES = 28, 32, 4, 64, 10


def transformer():
    inputs = keras.Input((ROWS, ROWS))  # an image's rows, each a token of 28 pixels
    x = keras.layers.Dense(WIDTH, name="embed")(inputs)
    h = keras.layers.LayerNormalization(name="ln1")(x)
    h = keras.layers.MultiHeadAttention(num_heads=HEADS, key_dim=WIDTH // HEADS, name="mha")(h, h)
    x = keras.layers.Add(name="residual1")([x, h])
    h = keras.layers.LayerNormalization(name="ln2")(x)
    h = keras.layers.Dense(UNITS, activation="gelu", name="up")(h)
    h = keras.layers.Dense(WIDTH, name="down")(h)
    x = keras.layers.Add(name="residual2")([x, h])
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    logits = keras.layers.Dense(CLASSES, name="head")(x)
    layout_map = keras.distribution.LayoutMap(None)
    layout_map["mha/(query|key|value)/kernel"] = (None, "model", None)  # [width, heads, head width]
    layout_map["mha/(query|key|value)/bias"] = ("model", None)
    layout_map["mha/attention_output/kernel"] = ("model", None, None)  # [heads, head width, width]
    layout_map["up/kernel"] = (None, "model")
    layout_map["up/bias"] = ("model",)
    layout_map["down/kernel"] = ("model", None)
    return keras.Model(inputs, logits, name="transformer_block"), layout_map
