"""An example test of a Keras Transformer block laid out by its own LayoutMap (examples/keras_transformer.py),
through check_model, float64: heads and the MLP split over a model axis of 4, and with --shard-weights the rest
split over the batch axis too; every trainer within 1e-8 of one device on every step.

    python -m pytest -m "" examples/test_keras_transformer.py
"""

import os

import pytest

pytest.importorskip(
    "keras",
    minversion="3",
    reason="Keras models need Keras 3 (TensorFlow 2.16 or later); this TensorFlow brings Keras 2",
)

from dtensor_vs_mirrored.shared.api import check_model

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = dict(devices=8, dtype="float64", epochs=1, batch_size=64, train_examples=256, test_examples=64)


# extended: a Keras model's LayoutMap on a model axis, in float64, runs by default in examples/test_keras_cnn.py.
@pytest.mark.extended
@pytest.mark.parametrize("mesh, shard_weights", [("batch=2,model=4", False), ("batch=4,model=2", True)])
def test_the_transformer_block_trains_one_devices_model_on_its_layout_map(mesh, shard_weights):
    result = check_model(f"{HERE}/keras_transformer.py:transformer", meshes=(mesh,), shard_weights=shard_weights, **RUN)
    assert result.ok, result.summary()
    assert set(result.parity) == {f"dtensor {mesh}", "mirrored"}
    for name, parity in result.parity.items():
        assert parity.max_abs_loss_diff <= 1e-8, (name, parity.max_abs_loss_diff)
