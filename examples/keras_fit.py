"""Keras's own model.fit under MirroredStrategy against model.fit on one device (--fit): compiled Keras models.

    python compare.py --model examples/keras_fit.py:plain --fit --data embedded --devices 4 --dtype float64 \\
        --train-examples 256 --test-examples 256 --batch-size 64 --epochs 2
    python compare.py --model examples/keras_fit.py:global_clipnorm --fit ...   # the same options
    python compare.py --model examples/keras_fit.py:transformer --fit --data embedded --devices 4 --dtype float64
    python -m pytest -m "" examples/test_keras_fit.py

Each function returns a built, compiled keras.Model, trained by model.fit on one device and under MirroredStrategy.
- `plain`: Dense-ReLU-Dense, Adam(1e-2): `ok`. `batch_norm`: `MISMATCH at step 0` (each replica normalises its own).
- `clipnorm`, `global_clipnorm`: Adam(1e-2, clipnorm=0.01) or (global_clipnorm=0.01): `MISMATCH at step 0: after
  its update every variable and Adam slot` (Keras clips each replica's part of the gradient before the all-reduce).
- `transformer`: a Transformer block over MNIST's 28 rows, AdamW(global_clipnorm=1.0): a MISMATCH from the first
  step that clips; the project's own trainers clip the combined gradient (`--clip-global-norm 1`) and are `ok`.
"""

import keras

HIDDEN, CLASSES = 32, 10


def dense_model(batch_norm: bool = False, **clipping) -> keras.Model:
    """The probe's model on MNIST: Dense(32, relu) [BatchNormalization] Dense(10), Adam(1e-2, **clipping)."""
    inputs = keras.Input((784,))
    x = keras.layers.Dense(HIDDEN, activation="relu", name="hidden")(inputs)
    if batch_norm:
        x = keras.layers.BatchNormalization(name="bn")(x)
    model = keras.Model(inputs, keras.layers.Dense(CLASSES, name="out")(x), name="dense")
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2, **clipping),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def plain():
    return dense_model()


def batch_norm():
    return dense_model(batch_norm=True)


def clipnorm():
    return dense_model(clipnorm=0.01)


def global_clipnorm():
    return dense_model(global_clipnorm=0.01)


def transformer(width: int = 32, heads: int = 4) -> keras.Model:
    """One pre-norm Transformer block over MNIST's rows as tokens (28 tokens of 28 pixels), mean-pooled, with
    AdamW(1e-3, global_clipnorm=1.0): the clipping most Transformer recipes use."""
    inputs = keras.Input((784,))
    tokens = keras.layers.Dense(width, name="embed")(keras.layers.Reshape((28, 28), name="rows")(inputs))
    normed = keras.layers.LayerNormalization(name="norm1")(tokens)
    attended = keras.layers.MultiHeadAttention(heads, width // heads, name="attention")(normed, normed)
    tokens = keras.layers.Add(name="residual1")([tokens, attended])
    hidden = keras.layers.Dense(2 * width, activation="gelu", name="mlp_in")(
        keras.layers.LayerNormalization(name="norm2")(tokens)
    )
    tokens = keras.layers.Add(name="residual2")([tokens, keras.layers.Dense(width, name="mlp_out")(hidden)])
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(tokens)
    model = keras.Model(inputs, keras.layers.Dense(CLASSES, name="out")(pooled), name="transformer")
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3, global_clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model
