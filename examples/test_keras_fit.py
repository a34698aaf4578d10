"""An example test of Keras's own model.fit (examples/keras_fit.py) through check_model(..., fit=True), in float64:
model.fit under MirroredStrategy computes one device's run for a plain model, and not once the optimizer's
global_clipnorm acts, since Keras clips each replica's part of the gradient; the reason says so.

    python -m pytest -m "" examples/test_keras_fit.py
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
SMALL = dict(devices=4, dtype="float64", epochs=1, batch_size=64, train_examples=128, test_examples=64, fit=True)
SMALL["trainer_process"] = "shared"  # every trainer in this process: a few seconds, not a process's start each


def test_model_fit_under_mirrored_strategy_is_one_devices_model_fit_step_for_step():
    result = check_model(f"{HERE}/keras_fit.py:plain", replica_counts=(2,), **SMALL)
    assert result.ok, result.summary()
    assert result.verdicts["mirrored 2"].verdict == "ok"
    assert result.parity["mirrored 2"].max_abs_loss_diff < 1e-14 and result.parity["mirrored 2"].steps == 2


def test_global_clipnorm_under_mirrored_strategy_is_a_mismatch_from_the_first_update_that_clips():
    result = check_model(f"{HERE}/keras_fit.py:global_clipnorm", replica_counts=(2,), **SMALL)
    mirrored, parity = result.verdicts["mirrored 2"], result.parity["mirrored 2"]
    losses = [result.run.results[name].history.step_losses for name in ("reference", "mirrored 2")]
    assert abs(losses[0][0] - losses[1][0]) < 1e-14  # step 0's loss and gradients: the same
    assert parity.first_loss_step_beyond == 1 and parity.max_abs_grad_diff < 1e-14
    assert mirrored.line().startswith("MISMATCH at step 0: after its update every variable and Adam slot")
    assert "the optimizer's global_clipnorm=0.01: clipping before the all-reduce: under MirroredStrategy" in (
        mirrored.reason
    )


# extended: the other two of the probe's models, 4 replicas and 2 epochs as docs/keras.md measures them.
@pytest.mark.extended
@pytest.mark.parametrize("name", ["batch_norm", "clipnorm"])
def test_batch_norm_and_clipnorm_are_mismatches_whose_reasons_name_keras_s_cause(name):
    result = check_model(f"{HERE}/keras_fit.py:{name}", **{**SMALL, "train_examples": 256, "epochs": 2})
    mirrored = result.verdicts["mirrored"]
    assert mirrored.verdict == "MISMATCH", result.summary()
    if name == "batch_norm":
        assert mirrored.reason.startswith("at step 0: loss, first-step gradients")
        assert "bn: batch norm per replica: Keras BatchNormalization without synchronized=True" in mirrored.reason
    else:
        assert result.parity["mirrored"].first_loss_step_beyond == 1
        assert "the optimizer's clipnorm=0.01: clipping before the all-reduce" in mirrored.reason
