"""--fit under mixed precision: Keras's own model.fit and its LossScaleOptimizer on one device against under
MirroredStrategy, judged step by step: each trainer's skipped steps and loss scale recorded per step, and a step one
side skips and the other applies a MISMATCH at that step that names the cause (Keras 3.15.1 takes the finite check
from replica 0's local gradients)."""

import pytest

from dtensor_vs_mirrored.shared.judge.mixed import first_skip_difference
from dtensor_vs_mirrored.shared.measure.history import History
from tests.cli import read_report, run_here
from tests.kernels import require_matmul
from tests.models.keras_mixed import write_normal, write_overflow

FIT = ["--fit", "--devices", "4", "--batch-size", "64", "--epochs", "1", "--quiet", "--no-timing"]
FIT += ["--trainer-process", "shared", "--dtype", "mixed_float16"]
MODEL = "tests/models/keras_mixed.py:float16_mlp"


def test_a_step_one_side_skips_and_the_other_applies_is_the_first_difference():
    reference = History("reference", "", step_loss_scales=[32768.0, 16384.0], skipped_step_indices=[0])
    mirrored = History("mirrored", "", step_loss_scales=[32768.0, 32768.0], skipped_step_indices=[1])
    assert first_skip_difference(mirrored, reference) == (
        0,
        "at step 0: loss scaling: the reference skipped it (a non-finite gradient by its check) at loss scale 32768, "
        "this trainer applied it at loss scale 32768",
    )
    assert first_skip_difference(reference, reference) is None
    assert first_skip_difference(History("mirrored", ""), reference) is None  # not recorded per step


# The custom loop's skipped steps on every trainer: tests/test_mixed_precision.py; --fit under mixed_float16: below.
@pytest.mark.extended
def test_keras_loss_scaling_that_applies_a_step_one_device_skips_is_a_mismatch_naming_the_step(tmp_path):
    """Replica 1's piece of the first global batch overflows in float16: one device skips step 0, MirroredStrategy
    applies it (replica 0's check was finite) and its hidden layer turns NaN."""
    require_matmul("float16")
    write_overflow(str(tmp_path / "overflow.npz"))
    report_path = tmp_path / "report.json"
    result = run_here(
        "--model", MODEL, "--data", tmp_path / "overflow.npz", *FIT, "--json", report_path
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    report = read_report(report_path)
    reason = report["parity"]["mirrored"]["reason"]
    assert report["parity"]["mirrored"]["verdict"] == "MISMATCH"
    assert reason.startswith(
        "at step 0: loss scaling: the reference skipped it (a non-finite gradient by its check) at loss scale "
        "32768, this trainer applied it at loss scale 32768; loss scaling on one replica's gradients: under "
        "MirroredStrategy Keras"
    ), reason
    assert "takes its finite check from replica 0's local gradients" in reason
    assert report["trainers"]["reference"]["skipped_steps"] == 1
    assert "caution (mirrored): loss scaling on one replica's gradients" in result.stdout


def test_keras_fit_under_mixed_float16_on_normal_data_gets_a_verdict(tmp_path):
    require_matmul("float16")
    write_normal(str(tmp_path / "normal.npz"))
    report_path = tmp_path / "report.json"
    result = run_here("--model", MODEL, "--data", tmp_path / "normal.npz", *FIT, "--json", report_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = read_report(report_path)
    assert report["parity"]["mirrored"]["verdict"] == "ok"
    assert {name: trainer["skipped_steps"] for name, trainer in report["trainers"].items()} == {
        "reference": 0,
        "mirrored": 0,
    }
    assert report["trainers"]["mirrored"]["details"]["loss scaling"] == (
        "Keras's LossScaleOptimizer: loss scale 32768, 0 of 4 steps skipped (a non-finite gradient by its check): none"
    )
