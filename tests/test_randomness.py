"""Dropout that every trainer draws alike (ForwardContext.dropout), and what happens to a forward that draws its
own random numbers: named in the reason, with the helper to use instead; the first differing tap located.

The models: tests/models/own_random.py; the built-in models' --dropout."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor

from dtensor_vs_mirrored.shared.api import check_model
from dtensor_vs_mirrored.shared.model.definition import Model
from dtensor_vs_mirrored.shared.model.forward import ForwardContext
from dtensor_vs_mirrored.shared.model.registry import load, random_ops

OWN = "tests/models/own_random.py"
EVERY_MESH_OF_8 = ("batch=8", "batch=4,model=2", "batch=2,model=4", "batch=1,model=8")
SMALL = dict(train_examples=256, test_examples=128, epochs=1, dtype="float64")


def dropped(x, rate, step, positions, seed=22, stream_calls=0):
    context = ForwardContext(training=True, seed=seed, step=tf.constant(step, tf.int64), positions=positions)
    for _ in range(stream_calls):
        context.dropout(x, rate)
    return context.dropout(x, rate)


def test_dropout_keeps_a_share_of_one_minus_rate_and_changes_with_step_call_and_seed():
    x = tf.ones([128, 500], tf.float64)
    positions = tf.range(128, dtype=tf.int64)
    mask = dropped(x, 0.3, 0, positions).numpy() != 0
    assert abs(mask.mean() - 0.7) < 0.01  # 64,000 draws: the share's spread is 0.002
    np.testing.assert_array_equal(dropped(x, 0.3, 0, positions).numpy(), dropped(x, 0.3, 0, positions).numpy())
    np.testing.assert_allclose(dropped(x, 0.3, 0, positions).numpy()[mask], 1 / 0.7)
    for other in (
        dropped(x, 0.3, 1, positions),
        dropped(x, 0.3, 0, positions, seed=23),
        dropped(x, 0.3, 0, positions, stream_calls=1),
    ):
        agree = np.mean((other.numpy() != 0) == mask)
        assert 0.5 < agree < 0.65  # independent masks agree on 0.7^2 + 0.3^2 = 58% of the units
    assert ForwardContext().dropout(x, 0.3) is x  # evaluation: no dropout


def test_dropout_follows_the_example_not_its_place_in_a_piece():
    """An example's mask is a function of its position in the global batch: a piece starting at 48 draws what
    the whole batch draws at 48.. (a MirroredStrategy replica's piece)."""
    x = tf.ones([128, 64], tf.float32)
    whole = dropped(x, 0.5, 3, tf.range(128, dtype=tf.int64)).numpy()
    piece = dropped(x[48:64], 0.5, 3, 48 + tf.range(16, dtype=tf.int64)).numpy()
    np.testing.assert_array_equal(piece, whole[48:64])


def test_dropout_on_a_dtensor_mesh_draws_one_devices_mask(devices):
    """Sharded on the batch axis and on the model axis, the mask is the one device's, element for element (a
    tf.random op here would draw each device's own: shared/model/forward.py)."""
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)

    @tf.function
    def draw(value):
        return dropped(value, 0.5, 5, tf.range(value.shape[0], dtype=tf.int64))

    with tf.device("/CPU:0"):
        want = draw(tf.constant(x)).numpy()
    mesh = dtensor.create_mesh([("batch", 4), ("model", 2)], devices=devices)
    for spec in (["batch", "unsharded"], ["batch", "model"], ["unsharded", "model"]):
        layout = dtensor.Layout(spec, mesh)
        value = dtensor.relayout(dtensor.copy_to_mesh(tf.constant(x), dtensor.Layout.replicated(mesh, 2)), layout)
        got = dtensor.relayout(draw(value), dtensor.Layout.replicated(mesh, 2)).numpy()
        np.testing.assert_array_equal(got, want)


# extended: by default test_the_same_model_through_the_helper_passes covers batch=8 and batch=2,model=4, and
# test_first_difference.py's replay a padded model axis with dropout.
@pytest.mark.extended
def test_the_mlp_with_dropout_matches_on_every_mesh_of_8_and_mirrored():
    result = check_model("mlp", meshes=EVERY_MESH_OF_8, hidden=(70, 50), dropout=0.3, **SMALL)
    assert result.ok, result.summary()
    losses = result.run.results["reference"].history.step_losses
    for name, parity in result.parity.items():
        assert parity.max_abs_loss_diff <= 1e-8, (name, parity.max_abs_loss_diff)
    assert len(losses) == 2


def test_the_built_in_models_drop_units_in_training_only(embedded):
    for name, inputs in (
        ("mlp", embedded.x_test[:4]),
        ("vit", embedded.x_test[:4]),
        ("gpt", np.zeros((4, 64), np.int32)),
    ):
        definition = load(name, None, 0.5)
        model = Model(definition, definition.initial_values(22))
        training = model(inputs, model.training_context(tf.constant(0, tf.int64), tf.range(4, dtype=tf.int64)))
        assert np.max(np.abs(training.numpy() - model(inputs).numpy())) > 1e-3, name
        plain = Model(load(name), definition.initial_values(22))
        np.testing.assert_array_equal(model(inputs).numpy(), plain(inputs).numpy())  # evaluation: none


def test_random_ops_names_what_a_forward_draws_and_not_the_helper():
    assert random_ops(load(f"{OWN}:stateless")) == ["StatelessRandomUniformV2"]
    assert any("Random" in op for op in random_ops(load(f"{OWN}:stateful")))
    assert random_ops(load(f"{OWN}:with_helper")) == []
    assert random_ops(load("vit", None, 0.1)) == []


def test_a_forward_drawing_its_own_mask_is_named_and_located():
    """stateless_uniform under DTensor: each device draws its own slice (MISMATCH at step 0, the first
    difference is the dropout tap); the reason names the op and the helper."""
    result = check_model(f"{OWN}:stateless", meshes=("batch=2",), devices=2, **SMALL)
    for name in ("dtensor batch=2", "mirrored"):
        found = result.verdicts[name]
        assert found.verdict == "MISMATCH", result.summary()
        assert "StatelessRandomUniformV2" in found.reason and "context.dropout" in found.reason
        difference = found.first_difference
        assert (difference.step, difference.tap, difference.phase) == (0, "dropout", "forward"), difference
        assert difference.agreed == ["dense"]


def test_a_stateful_random_op_fails_on_dtensor_with_the_helper_named():
    result = check_model(f"{OWN}:stateful", meshes=("batch=2",), devices=2, **SMALL)
    assert "Stateful" in result.errors["dtensor batch=2"] and "context.dropout" in result.errors["dtensor batch=2"]
    assert result.verdicts["mirrored"].verdict == "MISMATCH" and "context.dropout" in result.verdicts["mirrored"].reason


@pytest.mark.extended  # dropout through the helper agreeing on DTensor and MirroredStrategy, every tap and gradient:
# tests/test_first_difference.py's mid-run replay
def test_the_same_model_through_the_helper_passes():
    result = check_model(f"{OWN}:with_helper", meshes=("batch=2,model=4",), **SMALL)
    assert result.ok, result.summary()


@pytest.mark.parametrize("rate", [1.0, -0.1])
def test_a_dropout_rate_outside_0_1_is_one_line(rate):
    """Refused where a run starts (compare.py's flags, check_model's keywords, a Config made in Python)."""
    from dtensor_vs_mirrored.shared.config import Config
    from dtensor_vs_mirrored.shared.errors import UsageError
    from dtensor_vs_mirrored.shared.run.run_options import check_run_options

    with pytest.raises(UsageError, match=rf"^--dropout {rate}: a rate is at least 0 and below 1, e\.g\. 0\.1$"):
        check_run_options(Config(dropout=rate))
