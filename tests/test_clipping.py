"""--clip-global-norm: the gradient clipped to a global norm after each trainer has combined it, so the reference,
DTensor (its norm summed over sharded gradients) and MirroredStrategy's loop compute one device's clipped run."""

import numpy as np
import pytest
import tensorflow as tf

from dtensor_vs_mirrored.shared.api import check_model
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.training.optim import SGD, Adam, clip_by_global_norm, clipping_record
from tests.cli import run_here

EVERY_MESH_OF_8 = ("batch=8", "batch=4,model=2", "batch=2,model=4", "batch=1,model=8")
SMALL = dict(train_examples=256, test_examples=128, epochs=1, dtype="float64", trainer_process="shared")


def test_clipping_scales_the_whole_gradient_to_the_limit_and_leaves_a_smaller_one_alone():
    grads = [tf.constant([3.0, 0.0], tf.float64), tf.constant([[4.0]], tf.float64)]  # global norm 5
    clipped, above = clip_by_global_norm(grads, 1.0)
    np.testing.assert_allclose(clipped[0].numpy(), [0.6, 0.0])
    np.testing.assert_allclose(clipped[1].numpy(), [[0.8]])
    assert bool(above)
    same, above = clip_by_global_norm(grads, 10.0)
    np.testing.assert_array_equal(same[0].numpy(), grads[0].numpy())
    assert not bool(above)


@pytest.mark.parametrize("make", [SGD, Adam])
def test_an_optimizer_clips_what_it_is_handed_and_counts_the_steps_it_clipped(make):
    def optimizer(variables, clip_norm):
        zeros_like = lambda v: tf.Variable(tf.zeros_like(v))  # noqa: E731
        step = lambda: tf.Variable(0, dtype=tf.int64)  # noqa: E731
        if make is SGD:
            return SGD(0.1, step, clip_norm)
        return Adam(variables, 0.1, zeros_like, step, clip_norm=clip_norm)

    weights = [tf.Variable([1.0, 1.0], dtype=tf.float64)]
    clipping = optimizer(weights, 1.0)
    for scale in (10.0, 0.1, 10.0):  # norms 14.1, 0.14, 14.1: clipped twice
        clipping.apply_gradients([tf.constant([scale, scale], tf.float64)], weights)
    assert clipping_record(clipping) == "clipped 2 of 3 steps (global gradient norm above 1)"
    plain = optimizer([tf.Variable([1.0, 1.0], dtype=tf.float64)], None)
    assert clipping_record(plain) is None and "clipped" not in {v.name.split(":")[0] for v in plain.variables}
    if make is SGD:  # 1 - 0.1 * (10 / 14.14...) * ... : the clipped step moved each weight by 0.1 / sqrt(2)
        np.testing.assert_allclose(weights[0].numpy(), 1 - 0.1 * (2 / np.sqrt(2) + 0.1))


def test_every_trainer_clips_the_combined_gradient_alike_on_a_model_axis_and_under_mirrored_strategy():
    result = check_model("mlp", meshes=("batch=1,model=2",), devices=2, hidden=(31, 20), clip_global_norm=0.5, **SMALL)
    assert result.ok, result.summary()
    assert {name: verdict.verdict for name, verdict in result.verdicts.items()} == {
        "dtensor batch=1,model=2": "ok",  # hidden 31 padded to 32 on the model axis: a zero unit adds no norm
        "mirrored": "ok",
    }
    for name, trainer in result.run.results.items():
        assert trainer.history.details["clipping"] == "clipped 2 of 2 steps (global gradient norm above 0.5)", name
    assert max(parity.max_abs_loss_diff for parity in result.parity.values()) < 1e-13


def test_a_restore_across_clipping_settings_is_one_line(tmp_path):
    common = ["--data", "embedded", "--train-examples", "128", "--test-examples", "64", "--epochs", "1"]
    common += ["--hidden", "16", "--trainers", "reference", "--quiet", "--devices", "2"]
    written = run_here(*common, "--checkpoint-dir", str(tmp_path))
    assert written.returncode == 0, written.stderr
    refused = run_here(*common, "--epochs", "2", "--restore", str(tmp_path / "reference"), "--clip-global-norm", "1")
    assert refused.returncode == 2
    assert "was written without --clip-global-norm; drop --clip-global-norm to restore it" in refused.stderr


def test_a_clipping_limit_must_be_a_positive_number():
    from dtensor_vs_mirrored.shared.config import Config

    with pytest.raises(UsageError, match="argument --clip-global-norm: 0.0 is not a positive number"):
        Config(clip_global_norm=0.0)
