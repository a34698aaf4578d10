"""Keras models built as keras-hub builds its own (tests/models/keras_hub_shapes.py), in plain Keras: a layer of a
backbone called again outside it, the tied head, stays one layer in every copy the tool makes
(shared/model/keras_tied.py); float32 in a layer's own code computes in float64 in a float64 run
(shared/model/keras_downcasts.py). keras-hub's own Gemma: examples/test_keras_hub_gemma.py."""

import numpy as np
import pytest
import tensorflow as tf

keras = pytest.importorskip("keras", minversion="3", reason="Keras models need Keras 3")

from dtensor_vs_mirrored.shared.api import check_model  # noqa: E402 - after the skip: these need Keras 3
from dtensor_vs_mirrored.shared.model.definition import Model  # noqa: E402
from dtensor_vs_mirrored.shared.model.keras import rebuilt  # noqa: E402
from dtensor_vs_mirrored.shared.model.registry import load  # noqa: E402
from tests.models.keras_shapes import write_tokens  # noqa: E402

HUB_SHAPES = "tests/models/keras_hub_shapes.py"
FLOAT64 = dict(dtype="float64", epochs=1, batch_size=64, train_examples=128, test_examples=64)


def test_a_backbones_layer_called_again_outside_it_stays_one_layer_and_trains_on_every_trainer(devices, tmp_path):
    """Keras's config round trip made the outer call a layer of its own: the float64 copy held one variable more,
    and the model was refused ("rebuilt from its config in float64 has other variables than it")."""
    definition = load(f"{HUB_SHAPES}:tied_embedding")
    assert [variable.name for variable in definition.variables] == [
        "embed/embeddings", "dense/kernel", "dense/bias", "out/kernel", "out/bias"
    ]  # fmt: skip
    data = write_tokens(str(tmp_path / "tokens.npz"))
    result = check_model(f"{HUB_SHAPES}:tied_embedding", meshes=("batch=2,model=2",), devices=4, data=data, **FLOAT64)
    assert result.ok and len(result.verdicts) == 2, result.summary()
    assert all(verdict.verdict == "ok" for verdict in result.verdicts.values()), result.summary()
    assert all(parity.max_abs_loss_diff <= 1e-12 for parity in result.parity.values()), result.summary()


def test_a_compiled_tied_models_copies_take_no_compile_settings():
    """clone_model compiled the tied copies as the model is: an unregistered loss of the user's then failed every
    copy ("could not be rebuilt in float64 ... Could not locate function 'my_loss'"), and each copy built an Adam."""
    definition = load(f"{HUB_SHAPES}:tied_embedding_compiled")
    assert definition.keras_model.compiled  # the user's model as compiled, its loss the objective's
    copy = rebuilt(definition.keras_model, keras, "tied_embedding_compiled", "float64")
    assert not copy.compiled and getattr(copy, "optimizer", None) is None


def float64_logits(name):
    definition = load(f"{HUB_SHAPES}:{name}")
    values = [value.astype(np.float64) for value in definition.initial_values(0)]
    images = tf.constant(np.random.default_rng(5).uniform(size=(8, 28, 28)))
    return definition, Model(definition, values)(images).numpy()


def test_float32_in_a_layers_own_code_computes_in_float64_in_a_float64_run():
    """A Softmax fixed to float32 in a layer's __init__ and keras.ops.cast(x, "float32") in its call: before, the
    float64 run rounded through float32 (logits 1e-7 apart from the same layer computing in float64)."""
    definition, pinned = float64_logits("float32_inside")
    _, free = float64_logits("float32_free")  # the same layer in its own dtype, from the same seed
    assert pinned.dtype == np.float64
    np.testing.assert_array_equal(pinned, free)
    assert definition.description.endswith(
        "float32 in its layers' code kept float64 in a float64 run: 1 Softmax fixed to float32, keras.ops.cast to "
        "float32"
    )
    # Outside the tool's float64 forward keras.ops.cast is Keras's own, and the user's model is untouched.
    assert keras.ops.cast(tf.constant(1.0, tf.float64), "float32").dtype == "float32"
    assert definition.keras_model.get_layer("inside").softmax.dtype_policy.name == "float32"


def test_a_cast_to_float32_that_cannot_stay_float64_is_left_as_the_layers_code_has_it_and_said():
    definition, logits = float64_logits("cast_beside_float32")
    assert logits.dtype == np.float64 and np.all(np.isfinite(logits))
    assert definition.description.endswith(
        "float32 in its layers' code stays float32 in a float64 run (kept float64: InvalidArgumentError)"
    )
