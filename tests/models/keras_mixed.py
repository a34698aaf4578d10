"""Keras models under a mixed dtype policy, and the data that makes Keras's LossScaleOptimizer skip a step on one
replica's piece alone (../shared/probes/keras_loss_scale.py's).

    python -c "from tests.models.keras_mixed import write_overflow; write_overflow('overflow.npz')"
    python compare.py --model tests/models/keras_mixed.py:float16_mlp --fit --data overflow.npz --devices 4 \\
        --dtype mixed_float16 --batch-size 64
"""

import keras
import numpy as np

FEATURES, CLASSES = 20, 4


def mlp(policy: str, output_policy: str = "float32"):
    """Dense(32, relu) under `policy`, its output layer under `output_policy` (float32: Keras's guide keeps the
    output in float32), compiled with Adam(1e-3): under mixed_float16 compile wraps it in a LossScaleOptimizer."""
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(32, activation="relu", dtype=policy, name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(CLASSES, dtype=output_policy, name="out")(hidden))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def bfloat16_mlp():
    return mlp("mixed_bfloat16")


def float16_mlp():
    """The probe's model: every layer mixed_float16 but the float32 output, the model's own policy mixed_float16
    too (built under the global policy, as the probe builds it), so that compile wraps its Adam."""
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        return mlp("mixed_float16")
    finally:
        keras.config.set_dtype_policy(policy)


def float32_mlp():
    return mlp("float32")


def write_overflow(path: str, overflowing_replica: int = 1, examples: int = 128) -> None:
    """20 features of N(0, 0.1), 4 classes; the rows of the first global batch of 64 that `overflowing_replica` gets
    over 4 replicas (16 each, in order) times 3000: their float16 backward at Keras's scale 2**15 overflows."""
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(examples, FEATURES)) * 0.1).astype(np.float32)
    y = rng.integers(0, CLASSES, examples).astype(np.int64)
    x[16 * overflowing_replica : 16 * overflowing_replica + 16] *= 3000.0
    np.savez(path, x_train=x, y_train=y, x_test=x[64:], y_test=y[64:])


def write_normal(path: str, examples: int = 256) -> None:
    """The same features without the overflowing rows."""
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(examples, FEATURES)) * 0.1).astype(np.float32)
    y = rng.integers(0, CLASSES, examples).astype(np.int64)
    np.savez(path, x_train=x, y_train=y, x_test=x[: examples // 4], y_test=y[: examples // 4])
