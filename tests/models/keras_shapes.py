"""Keras models shaped as users build them, for tests/test_keras_shapes.py: a base model inside a functional one,
a reused layer, recurrent layers, preprocessing with its constants, a subclassed model on tokens."""

import keras
import numpy as np

SEQUENCE, VOCABULARY, CLASSES = 12, 20, 4


def images(count=64):
    return np.random.default_rng(0).uniform(size=(count, 28, 28)).astype(np.float32)


def nested_base():
    """Transfer learning's shape: an adapted Normalization, then a Sequential base called as a layer."""
    layers = [keras.layers.Flatten(name="flat"), keras.layers.Dense(16, activation="relu", name="dense")]
    base = keras.Sequential([keras.Input((28, 28)), *layers], name="base")
    norm = keras.layers.Normalization(name="norm")
    norm.adapt(images())
    inputs = keras.Input((28, 28))
    features = base(norm(inputs))
    return keras.Model(inputs, keras.layers.Dense(10, name="head")(features))


def reused_layer():
    inputs = keras.Input((28, 28))
    flat = keras.layers.Flatten(name="flat")(inputs)
    shared = keras.layers.Dense(784, activation="tanh", name="shared")
    twice = shared(shared(flat))
    return keras.Model(inputs, keras.layers.Dense(10, name="out")(twice))


def tokens(recurrent):
    inputs = keras.Input((SEQUENCE,), dtype="int32", name="token_ids")
    embedded = keras.layers.Embedding(VOCABULARY, 8, name="embed")(inputs)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, name="out")(recurrent(embedded)))


def lstm():
    return tokens(keras.layers.LSTM(8, name="lstm"))


def lstm_dropout():
    return tokens(keras.layers.LSTM(8, dropout=0.2, name="lstm"))


def gru():
    return tokens(keras.layers.GRU(8, name="gru"))


def bidirectional():
    return tokens(keras.layers.Bidirectional(keras.layers.LSTM(6, name="lstm"), name="bi"))


def normalization_constants():
    inputs = keras.Input((28, 28))
    normalized = keras.layers.Normalization(mean=0.13, variance=0.09, name="norm")(inputs)
    flat = keras.layers.Flatten(name="flat")(normalized)
    return keras.Model(inputs, keras.layers.Dense(10, name="out")(flat))


class TokenClassifier(keras.Model):
    def __init__(self, **options):
        super().__init__(**options)
        self.embed = keras.layers.Embedding(VOCABULARY, 8)
        self.pool = keras.layers.GlobalAveragePooling1D()
        self.out = keras.layers.Dense(CLASSES)

    def call(self, inputs):
        return self.out(self.pool(self.embed(inputs)))


class RecurrentClassifier(keras.Model):
    """A subclassed LSTM classifier: its config remakes its layers, so it does not carry an unroll the tool sets."""

    def __init__(self, **options):
        super().__init__(**options)
        self.embed = keras.layers.Embedding(VOCABULARY, 8)
        self.lstm = keras.layers.LSTM(8)
        self.out = keras.layers.Dense(CLASSES)

    def call(self, inputs):
        return self.out(self.lstm(self.embed(inputs)))


def subclassed_lstm():
    model = RecurrentClassifier()
    model(keras.ops.zeros((1, SEQUENCE), "int32"))
    return model


def subclassed_tokens():
    model = TokenClassifier()
    model(keras.ops.zeros((1, SEQUENCE), "int32"))
    return model


def write_tokens(path, train=256, test=128):
    rng = np.random.default_rng(1)
    x = rng.integers(0, VOCABULARY, size=(train + test, SEQUENCE)).astype(np.int32)
    y = (x[:, 0] + x[:, -1]) % CLASSES
    np.savez(path, x_train=x[:train], y_train=y[:train], x_test=x[train:], y_test=y[train:])
    return path


def token_base():
    """A functional base on token ids, called on an Input of the same name."""
    ids = keras.Input((SEQUENCE,), dtype="int32", name="token_ids")
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(keras.layers.Embedding(VOCABULARY, 8, name="embed")(ids))
    base = keras.Model(ids, keras.layers.Dense(8, activation="tanh", name="dense")(pooled), name="base")
    inputs = keras.Input((SEQUENCE,), dtype="int32", name="token_ids")
    return keras.Model(inputs, keras.layers.Dense(CLASSES, name="out")(base(inputs)))


def batch_norm_base():
    """A base with Keras's own BatchNormalization: MirroredStrategy normalises each replica's piece."""
    layers = [
        keras.layers.Flatten(name="flat"),
        keras.layers.Dense(16, name="dense"),
        keras.layers.BatchNormalization(name="bn"),
    ]
    base = keras.Sequential([keras.Input((28, 28)), *layers], name="base")
    inputs = keras.Input((28, 28))
    return keras.Model(inputs, keras.layers.Dense(10, name="head")(base(inputs)))


class PooledTokens(keras.Model):
    """Token ids whose Embedding is not its first layer: its input_spec names their dtype."""

    def __init__(self, **options):
        super().__init__(**options)
        self.pool = keras.layers.GlobalAveragePooling1D()
        self.embed = keras.layers.Embedding(VOCABULARY, 8)
        self.out = keras.layers.Dense(CLASSES)
        self.input_spec = keras.InputSpec(dtype="int32", shape=(None, SEQUENCE))

    def call(self, inputs):
        return self.out(self.pool(self.embed(inputs)))


def subclassed_input_spec():
    model = PooledTokens()
    model(keras.ops.zeros((1, SEQUENCE), "int32"))
    return model


def convolution(depthwise=True):
    """keras.applications' MobileNets' and EfficientNets' shape: a depthwise convolution (else a grouped one)."""
    inputs = keras.Input((28, 28, 1))
    x = keras.layers.Conv2D(8, 3, name="conv")(inputs)
    x = (
        keras.layers.DepthwiseConv2D(3, name="dw")(x)
        if depthwise
        else keras.layers.Conv2D(8, 3, groups=8, name="gc")(x)
    )
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10, name="out")(x))


def grouped_convolution():
    return convolution(depthwise=False)
