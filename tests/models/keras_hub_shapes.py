"""Keras models built the way keras-hub builds its own, in plain Keras, for tests/test_keras_hub_shapes.py: a
backbone model whose layer the outer graph calls again (keras-hub's tied head), and a layer that computes in
float32 in its own code (keras-hub's attention softmax and RMSNormalization, made for bfloat16 models)."""

import keras
import tensorflow as tf

from tests.models.keras_shapes import CLASSES, SEQUENCE, VOCABULARY


def tied_embedding():
    """A backbone called as a layer, and its embedding called again outside it (before it, in the outer graph)."""
    embed = keras.layers.Embedding(VOCABULARY, 8, name="embed")
    base_ids = keras.Input((SEQUENCE,), dtype="int32", name="base_ids")
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(embed(base_ids))
    backbone = keras.Model(base_ids, keras.layers.Dense(8, activation="tanh", name="dense")(pooled), name="backbone")
    token_ids = keras.Input((SEQUENCE,), dtype="int32", name="token_ids")
    again = keras.layers.GlobalAveragePooling1D(name="pool_again")(embed(token_ids))
    features = keras.layers.Add(name="add")([again, backbone(token_ids)])
    return keras.Model(token_ids, keras.layers.Dense(CLASSES, name="out")(features))


def tied_embedding_compiled():
    """tied_embedding compiled with a loss of the user's own, not registered with Keras (a model a Keras user
    compiles in the same file), and Adam."""

    def my_loss(labels, logits):
        return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)

    model = tied_embedding()
    model.compile(optimizer="adam", loss=my_loss)
    return model


class Float32Inside(keras.layers.Layer):
    """A softmax and a normalisation as keras-hub computes them, in float32 whatever the model's dtype (`in_float32`),
    or in the layer's own dtype."""

    def __init__(self, in_float32=True, **options):
        super().__init__(**options)
        self.in_float32 = in_float32
        self.softmax = keras.layers.Softmax(dtype="float32" if in_float32 else self.dtype_policy)

    def call(self, x):
        ops = keras.ops
        normed = ops.cast(x, "float32") if self.in_float32 else x
        normed = normed / ops.sqrt(ops.mean(ops.square(normed), axis=-1, keepdims=True) + 1e-6)
        return ops.cast(normed, self.compute_dtype) + ops.cast(self.softmax(x), self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "in_float32": self.in_float32}


def images_through(layer):
    inputs = keras.Input((28, 28))
    hidden = keras.layers.Dense(16, name="dense")(keras.layers.Flatten(name="flat")(inputs))
    return keras.Model(inputs, keras.layers.Dense(10, name="out")(layer(hidden)))


def float32_inside():
    return images_through(Float32Inside(name="inside"))


def float32_free():
    return images_through(Float32Inside(in_float32=False, name="inside"))


class CastBesideFloat32(keras.layers.Layer):
    """A cast to float32 whose result a TensorFlow op adds to a float32 tensor: kept float64 it would raise."""

    def call(self, x):
        return tf.math.add(keras.ops.cast(x, "float32"), tf.ones((), tf.float32))


def cast_beside_float32():
    return images_through(CastBesideFloat32(name="beside"))
