"""Compiled Keras models whose compile settings meet --fit's float64 copy: a loss given by name (Keras builds it at
the first fit, in float32 unless the tool resolves it) and a metric with no float64 kernel (top-k's InTopKV2)."""

import keras


def softmax_string_loss():
    model = keras.Sequential(
        [keras.Input((784,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10, activation="softmax")]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


def top_k_metric():
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseTopKCategoricalAccuracy(k=3), "sparse_top_k_categorical_accuracy", "accuracy"],
    )
    return model
