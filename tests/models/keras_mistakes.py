"""Keras models with the mistakes users make, for tests/test_keras.py and tests/test_fit.py: `--model
tests/models/keras_mistakes.py:NAME`.

Each is a small Dense model with one thing no trainer could train: never built, two inputs, two outputs, a
LayoutMap that names another axis, gives the wrong rank or matches a path twice, float16 weights; for --fit,
several steps per call, or no compile at all.
"""

import keras


def dense(layout_map=None, **input_options):
    inputs = keras.Input((784,), **input_options)
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(10, name="out")(hidden))
    return model if layout_map is None else (model, layout_map)


def layout_map(**keys):
    found = keras.distribution.LayoutMap(None)
    for key, axes in keys.items():
        found[key.replace("__", "/")] = axes
    return found


class Subclassed(keras.Model):
    def __init__(self, **options):
        super().__init__(**options)
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.out = keras.layers.Dense(10)

    def call(self, inputs):
        return self.out(self.hidden(inputs))


def never_called():
    return Subclassed()


def subclassed():
    model = Subclassed()
    model(keras.ops.zeros((1, 784)))
    return model


def two_inputs():  # a list of two Inputs: trains since issue 59 (tests/test_keras_inputs.py)
    left, right = keras.Input((392,)), keras.Input((392,))
    joined = keras.layers.Concatenate()([left, right])
    return keras.Model([left, right], keras.layers.Dense(10)(joined))


def two_outputs():
    inputs = keras.Input((784,))
    return keras.Model(inputs, [keras.layers.Dense(10)(inputs), keras.layers.Dense(10)(inputs)])


def data_axis():
    return dense(layout_map(hidden__kernel=(None, "data")))


def wrong_rank():
    return dense(layout_map(hidden__kernel=("model",)))


def two_keys():
    return dense(layout_map(**{"hidden__.*": (None, "model"), ".*__kernel": ("model", None)}))


def indivisible():
    return dense(layout_map(out__kernel=(None, "model")))  # 10 logits over a model axis of 4


def float16():
    keras.config.set_floatx("float16")
    try:
        return dense()
    finally:
        keras.config.set_floatx("float32")


def two_mixed_policies():
    inputs = keras.Input((784,))
    hidden = keras.layers.Dense(16, activation="relu", dtype="mixed_bfloat16", name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(10, dtype="mixed_float16", name="out")(hidden))


def float16_policy():
    inputs = keras.Input((784,))
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(10, name="out")(hidden))
    model.get_layer("out").dtype_policy = keras.DTypePolicy("float16")  # its variables stay float32
    return model


def softmax_output():
    inputs = keras.Input((784,))
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax", name="probabilities")(inputs))


def regularized():
    inputs = keras.Input((784,))
    return keras.Model(inputs, keras.layers.Dense(10, kernel_regularizer="l2", name="out")(inputs))


def not_a_model():
    return keras.layers.Dense(10)


def tokens_without_embedding():
    inputs = keras.Input((16,), dtype="int32")
    return keras.Model(inputs, keras.layers.Dense(10, name="out")(keras.ops.cast(inputs, "float32")))


def embedded_tokens():
    """Not a mistake: token ids, embedded; the vocabulary is the Embedding's."""
    inputs = keras.Input((16,), dtype="int32")
    embedded = keras.layers.Embedding(65, 8, name="embed")(inputs)
    return keras.Model(inputs, keras.layers.Dense(65, name="out")(embedded))


def several_steps_per_call():
    """--fit records each step's loss after it: steps_per_execution must be 1."""
    model = dense()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", steps_per_execution=4)
    return model


def uncompiled():
    """--fit compiles it with the tool's optimizer and softmax cross-entropy of its logits."""
    return dense()
