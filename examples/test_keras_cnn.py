"""An example test of a Keras model as it is (examples/keras_cnn.py), through check_model, in float64 on 4 devices:
with BatchNormalization(synchronized=True) and the drop-in Dropout every trainer computes one device's model;
Keras's plain BatchNormalization is a MISMATCH at step 0 under MirroredStrategy whose reason names the layer.

    python -m pytest -m "" examples/test_keras_cnn.py
"""

import os
import re
import sys

import pytest

pytest.importorskip(
    "keras",
    minversion="3",
    reason="Keras models need Keras 3 (TensorFlow 2.16 or later); this TensorFlow brings Keras 2",
)

from dtensor_vs_mirrored.shared.api import check_model

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from write_images import write_images  # noqa: E402 - examples/ is no package: its image writer, by path

SMALL = dict(devices=4, dtype="float64", epochs=1, batch_size=32, train_examples=64, test_examples=32)
SMALL["trainer_process"] = "shared"  # every trainer in this process: a few seconds, not a process's start each


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("keras") / "images.npz")
    write_images(path, train=64, test=32)
    return path


def test_synchronized_batch_norm_and_the_drop_in_dropout_are_one_devices_model_everywhere(images):
    result = check_model(f"{HERE}/keras_cnn.py:synchronized", meshes=("batch=2,model=2",), data=images, **SMALL)
    assert result.ok, result.summary()
    assert {name: verdict.verdict for name, verdict in result.verdicts.items()} == {
        "dtensor batch=2,model=2": "ok",
        "mirrored": "ok",
    }
    assert max(parity.max_abs_loss_diff for parity in result.parity.values()) < 1e-13


def test_plain_batch_norm_is_a_mismatch_at_step_0_under_mirrored_strategy_naming_the_layer(images):
    result = check_model(f"{HERE}/keras_cnn.py:keras_cnn", trainers=("mirrored",), data=images, **SMALL)
    mirrored = result.verdicts["mirrored"]
    assert mirrored.verdict == "MISMATCH" and mirrored.reason.startswith("at step 0: loss, first-step gradients")
    assert re.search(r"first difference at step 0: bn \(forward\) by [\d.]+; agreed before it: conv", mirrored.reason)
    assert "bn: Keras BatchNormalization without synchronized=True normalises each MirroredStrategy" in mirrored.reason


EVERY_MESH_OF_8 = ("batch=8", "batch=4,model=2", "batch=2,model=4", "batch=1,model=8")


# extended: the drop-in on a mesh with a model axis runs by default above.
@pytest.mark.extended
def test_the_drop_in_dropout_is_ok_on_every_mesh_of_8(images):
    result = check_model(
        f"{HERE}/keras_cnn.py:synchronized", meshes=EVERY_MESH_OF_8, data=images, **{**SMALL, "devices": 8}
    )
    assert result.ok, result.summary()
    assert sorted(result.verdicts) == sorted([f"dtensor {mesh}" for mesh in EVERY_MESH_OF_8] + ["mirrored"])


# extended: the reason's text is asserted by default in tests/test_keras.py, a random op's MISMATCH in
# tests/test_randomness.py.
@pytest.mark.extended
def test_kerass_own_dropout_is_a_mismatch_whose_reason_names_it_and_the_drop_in(images):
    result = check_model(f"{HERE}/keras_cnn.py:keras_dropout", meshes=("batch=4",), data=images, **SMALL)
    for name in ("dtensor batch=4", "mirrored"):
        reason = result.verdicts[name].reason
        assert result.verdicts[name].verdict == "MISMATCH" and "first difference at step 0: drop (forward)" in reason
        assert "drop: Keras Dropout draws from a seed state" in reason
        assert reason.endswith("build it with a rate of 0 (a keras-hub backbone's dropout=0) (docs/keras.md)")
