"""Keras models as users build them (tests/models/keras_shapes.py), trained as they are: a base model called as a
layer and a reused layer (tapped from the outer graph's calls), recurrent layers (an unrolled copy on every
trainer), preprocessing (Keras's non-float bookkeeping carried, a layer's constants laid out on the DTensor mesh)
and a subclassed model on token ids (shared/model/keras_compute.py, keras_recurrent.py, dtensor_impl/captures.py).
"""

import numpy as np
import pytest
import tensorflow as tf

keras = pytest.importorskip("keras", minversion="3", reason="Keras models need Keras 3")

from dtensor_vs_mirrored.shared.api import check_model  # noqa: E402 - after the skip: these need Keras 3
from dtensor_vs_mirrored.shared.model.definition import Model  # noqa: E402
from dtensor_vs_mirrored.shared.model.forward import ForwardContext  # noqa: E402
from dtensor_vs_mirrored.shared.model.registry import load  # noqa: E402
from tests.models.keras_shapes import SEQUENCE, VOCABULARY, write_tokens  # noqa: E402

SHAPES = "tests/models/keras_shapes.py"
FLOAT64 = dict(dtype="float64", epochs=1, batch_size=64, train_examples=128, test_examples=64)
EVERY_MESH = ("batch=4", "batch=2,model=2")


def tokens(count=8):
    return tf.constant(np.random.default_rng(2).integers(0, VOCABULARY, (count, SEQUENCE)), tf.int32)


def recorded(name, inputs):
    """(tap names, logits recorded, logits not recorded) of the float64 forward at the initial values."""
    definition = load(f"{SHAPES}:{name}")
    model = Model(definition, [value.astype(np.float64) for value in definition.initial_values(0)])
    context = ForwardContext(training=True, step=tf.constant(0, tf.int64), record=True)
    logits = model(inputs, context)
    return [tap for tap, _ in context.taps], logits.numpy(), model(inputs, ForwardContext(training=True)).numpy()


@pytest.mark.parametrize(
    "name, taps",
    [
        ("nested_base", ["norm", "base/flat", "base/dense", "base", "head"]),
        ("reused_layer", ["flat", "shared", "shared#2", "out"]),
        ("token_base", ["base/embed", "base/pool", "base/dense", "base", "out"]),
    ],
)
def test_each_call_of_a_layer_is_a_tap_from_the_outer_graph_and_a_base_models_layers_under_its_name(name, taps):
    inputs = tokens() if name == "token_base" else tf.constant(np.random.default_rng(3).uniform(size=(8, 28, 28)))
    found, logits, untapped = recorded(name, inputs)
    assert found == taps
    np.testing.assert_array_equal(logits, untapped)  # recording computes the same logits, exactly


def test_a_first_difference_names_a_layer_inside_a_base_model(devices):
    """Keras's BatchNormalization inside a Sequential base: MirroredStrategy's replicas normalise their own pieces,
    and the float64 replay names the base's layer."""
    result = check_model(f"{SHAPES}:batch_norm_base", trainers=("mirrored",), devices=2, **FLOAT64)
    verdict = result.verdicts["mirrored"]
    assert verdict.verdict == "MISMATCH" and verdict.first_difference.tap == "base/bn", result.summary()
    assert verdict.first_difference.agreed == ["base/flat", "base/dense"]
    assert "first difference at step 0: base/bn (forward)" in verdict.line()


def test_a_base_model_after_an_adapted_normalization_is_parity_ok_on_every_trainer_and_mesh(devices):
    result = check_model(f"{SHAPES}:nested_base", meshes=EVERY_MESH, devices=4, **FLOAT64)
    assert result.ok and set(result.verdicts) == {"dtensor batch=4", "dtensor batch=2,model=2", "mirrored"}
    assert all(verdict.verdict == "ok" for verdict in result.verdicts.values()), result.summary()


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.extended)
        for name in ("lstm", "reused_layer", "token_base", "gru", "bidirectional")
    ],
)  # extended: their taps are the test above's, an unrolled LSTM on DTensor the subclassed one's below; each 20-57 s
def test_recurrent_and_reused_layers_are_parity_ok_on_every_trainer_and_mesh(name, devices, tmp_path):
    data = {} if name == "reused_layer" else {"data": write_tokens(str(tmp_path / "tokens.npz"))}
    result = check_model(f"{SHAPES}:{name}", meshes=EVERY_MESH, devices=4, **data, **FLOAT64)
    assert result.ok and len(result.verdicts) == 3, result.summary()
    assert all(verdict.verdict == "ok" for verdict in result.verdicts.values()), result.summary()


def test_a_recurrent_layer_trains_unrolled_the_same_maths_as_kerass_loop_and_says_so():
    definition = load(f"{SHAPES}:lstm")
    assert definition.description.endswith(
        "lstm: trained unrolled (a copy rebuilt with unroll=True, on every trainer: the same maths as Keras's loop, "
        "which DTensor cannot lay out)"
    )
    assert not definition.keras_model.get_layer("lstm").unroll  # the user's own model is untouched
    own = definition.keras_model(tokens(), training=False).numpy()
    unrolled = Model(definition, definition.initial_values(0))(tokens()).numpy()
    np.testing.assert_allclose(unrolled, own, rtol=0, atol=1e-6)
    assert definition.cautions == ()  # its cell's dropout and recurrent_dropout are 0: it draws nothing


def test_a_subclassed_recurrent_model_trains_unrolled_on_dtensor_in_float64_too(devices, tmp_path):
    data = write_tokens(str(tmp_path / "tokens.npz"))
    result = check_model(f"{SHAPES}:subclassed_lstm", meshes=("batch=2",), trainers=("dtensor",), devices=2,
                         data=data, **FLOAT64)  # fmt: skip
    assert result.ok and result.verdicts["dtensor batch=2"].verdict == "ok", result.summary()


def test_a_recurrent_cell_that_drops_is_a_random_layer_caution():
    (caution,) = load(f"{SHAPES}:lstm_dropout").cautions
    assert caution.random and caution.text.startswith("lstm_cell: Keras LSTMCell draws from a seed state")


def test_an_adapted_normalizations_count_is_carried_and_its_mean_computes_in_float64_too():
    definition = load(f"{SHAPES}:nested_base")
    names = [variable.name for variable in definition.variables if not variable.trainable]
    assert names == ["norm/mean", "norm/variance"]  # norm/count, int64, is Keras's bookkeeping: not a variable here
    values = definition.initial_values(0)
    images = tf.constant(np.random.default_rng(4).uniform(size=(8, 28, 28)).astype(np.float32))
    float32 = Model(definition, values)(images).numpy()
    float64 = Model(definition, [value.astype(np.float64) for value in values])(images).numpy()
    np.testing.assert_allclose(float64, float32, rtol=0, atol=1e-5)  # the copy normalises with the adapted mean


def test_a_layers_constant_is_laid_out_on_the_dtensor_mesh(devices):
    """Normalization(mean=..., variance=...) holds its mean as a tensor it made when built: DTensor refused it as
    an input of the traced step ("got a regular tensor ... use copy_to_mesh") until it was laid out, replicated."""
    result = check_model(f"{SHAPES}:normalization_constants", meshes=("batch=2",), trainers=("dtensor",), devices=2,
                         **FLOAT64)  # fmt: skip
    assert result.ok and result.verdicts["dtensor batch=2"].verdict == "ok", result.summary()


def test_a_subclassed_model_whose_first_layer_is_an_embedding_takes_token_ids():
    definition = load(f"{SHAPES}:subclassed_tokens")
    assert (definition.input_dtype, definition.vocabulary) == ("int32", VOCABULARY)
    assert definition.description.endswith("; a subclassed model is not tapped")
    assert load(f"{SHAPES}:subclassed_input_spec").input_dtype == "int32"  # its Embedding is not its first layer


def test_a_traced_steps_captured_constant_goes_on_the_mesh_replicated_where_dtensor_refuses_it(devices):
    from tensorflow.experimental import dtensor

    from dtensor_vs_mirrored.dtensor_impl.captures import on_mesh

    mesh = dtensor.create_mesh([("batch", 2)], devices=devices[:2])
    weight = dtensor.DVariable(dtensor.copy_to_mesh(tf.ones([28]), dtensor.Layout.replicated(mesh, 1)))
    constant = tf.constant(np.arange(3 * 28, dtype=np.float32).reshape(3, 28))  # 84 values: not auto-broadcast

    def step():
        return tf.reduce_sum(weight * constant[1])

    with pytest.raises(tf.errors.UnimplementedError, match="got a regular tensor"):
        tf.function(step)()
    assert float(on_mesh(step)()) == float(np.sum(np.arange(28, 56)))


@pytest.mark.parametrize(
    "name, layer, error",
    [
        ("convolution", "dw", "'tf.DepthwiseConv2dNativeBackpropFilter' op does not implement layout propagation"),
        pytest.param(
            "grouped_convolution", "gc", "filter_size does not have enough elements", marks=pytest.mark.extended
        ),
    ],
)
def test_dtensor_fails_on_a_depthwise_or_grouped_convolution_as_its_caution_says_and_mirrored_trains_it(
    name, layer, error, devices
):
    """TensorFlow 2.21's DTensor has no layout for a depthwise filter's gradient and fails on a grouped one: the
    header's caution names the layer before anything trains, and is DTensor's FAILED reason; when a release fixes
    it, this test fails and the caution goes."""
    (caution,) = load(f"{SHAPES}:{name}").cautions
    assert caution.trainers == ("dtensor",) and caution.text.startswith(f"{layer}: depthwise or grouped convolutions")
    result = check_model(f"{SHAPES}:{name}", meshes=("batch=2",), devices=2, **FLOAT64)
    assert set(result.errors) == {"dtensor batch=2"} and caution.text in result.errors["dtensor batch=2"]
    assert error in " ".join(result.errors["dtensor batch=2"].split()), result.summary()
    assert result.verdicts["mirrored"].verdict == "ok", result.summary()
