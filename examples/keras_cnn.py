"""Your Keras model, as it is: a Conv2D + BatchNormalization + Dropout CNN on 32x32x3 images, three ways.

    python examples/write_images.py images.npz                  # a deterministic set of 32x32x3 images
    python compare.py --model examples/keras_cnn.py:keras_cnn --data images.npz --devices 4 --dtype float64
    python compare.py --model examples/keras_cnn.py:synchronized --data images.npz --dtype float64
    python compare.py --model examples/keras_cnn.py:keras_dropout --data images.npz --devices 4 --dtype float64
    python -m pytest -m "" examples/test_keras_cnn.py
A function returns a built keras.Model, or (model, LayoutMap), called after `keras.utils.set_random_seed(--seed)`;
its own variables train with Keras's own forward, the LayoutMap splitting the dense layer over a `model` axis.

- `keras_cnn`: BatchNormalization as Keras makes it: DTensor `ok`, MirroredStrategy `MISMATCH at step 0` (each
  replica normalises its own piece of the batch).
- `synchronized`: BatchNormalization(synchronized=True): `ok` on both, on every mesh.
- `keras_dropout`: keras.layers.Dropout instead of the drop-in
  dtensor_vs_mirrored.shared.model.keras_layers.Dropout: a MISMATCH on both whose reason names it.
"""

import keras

from dtensor_vs_mirrored.shared.model.keras_layers import Dropout

UNITS, CLASSES = 32, 10


def build(synchronized: bool, dropout) -> tuple:
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, activation="relu", name="conv")(inputs)
    x = keras.layers.BatchNormalization(synchronized=synchronized, name="bn")(x)
    x = keras.layers.MaxPooling2D(2, name="pool")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = dropout(0.3, name="drop")(x)
    x = keras.layers.Dense(UNITS, activation="relu", name="dense")(x)
    logits = keras.layers.Dense(CLASSES, name="out")(x)  # logits: the loss applies the softmax
    layout_map = keras.distribution.LayoutMap(None)  # no mesh of Keras's: compare.py makes the meshes
    layout_map["dense/kernel"] = (None, "model")
    layout_map["dense/bias"] = ("model",)
    layout_map["out/kernel"] = ("model", None)
    return keras.Model(inputs, logits, name="keras_cnn"), layout_map


def keras_cnn():
    return build(synchronized=False, dropout=Dropout)


def synchronized():
    return build(synchronized=True, dropout=Dropout)


def keras_dropout():
    return build(synchronized=True, dropout=keras.layers.Dropout)
