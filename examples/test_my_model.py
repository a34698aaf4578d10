"""An example test of your own model, run by this project's suite: copy it beside your model.

    python -m pytest -m "" examples/test_my_model.py

`check_model` trains the model with the single-device reference, DTensor on each mesh and
MirroredStrategy, from the same start on the same batches, and returns compare.py's verdicts
(a float32 difference is rerun in float64 to tell float noise from a real difference). Small
slices keep it to about a minute on 2 CPU cores.
"""

import os

import pytest

from dtensor_vs_mirrored.shared.api import check_model

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = dict(epochs=2, train_examples=512, test_examples=256, data="embedded")


@pytest.mark.extended  # a user's file through check_model: examples/test_cnn_images.py
def test_my_model_trains_the_same_with_dtensor_and_mirrored_strategy():
    # One mesh with a model axis (its layouts are the model's own); add "batch=8" and others as you need.
    result = check_model(f"{HERE}/my_model.py:my_model", meshes=("batch=2,model=4",), **SMALL)
    assert result.ok, result.summary()
    assert set(result.verdicts) == {"dtensor batch=2,model=4", "mirrored"}
    assert all(verdict.verdict in ("ok", "float noise") for verdict in result.verdicts.values())


# extended: tests/test_first_difference.py runs the same model with compare.py by default (and its JSON).
@pytest.mark.extended
def test_batch_statistics_match_on_dtensor_and_not_under_mirrored_strategy():
    """Normalising over the batch: DTensor's global batch is one device's; each replica's 64 examples are not
    (2 devices here: as on 8, where each replica normalises over 16)."""
    result = check_model(f"{HERE}/batch_norm_mlp.py:batch_norm_mlp", meshes=("batch=2",), devices=2, **SMALL)
    assert result.verdicts["dtensor batch=2"].ok, result.summary()
    mirrored = result.verdicts["mirrored"]
    assert mirrored.verdict == "MISMATCH" and mirrored.first_disagreeing_step == 0, result.summary()
    assert {"loss", "first-step gradients"} <= set(mirrored.differing)
    assert mirrored.first_difference.tap == "norm"  # the first layer whose output differs; "dense" agrees
    assert not result.ok
