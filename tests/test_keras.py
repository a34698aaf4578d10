"""A Keras 3 model through --model FILE.py:FUNCTION (shared/model/keras.py): its variables named by their paths and
laid out by its LayoutMap, built from the run's seed, computed in float64 end to end in a float64 run, saved back as
a .keras file that plain Keras loads, and each mistake a user makes one line (exit 2). The trainers' verdicts on
Keras models: examples/test_keras_cnn.py, examples/test_keras_transformer.py.
"""

import json
import os
import subprocess
import sys

import jsonschema
import numpy as np
import pytest
import tensorflow as tf

keras = pytest.importorskip(
    "keras",
    minversion="3",
    reason="Keras models need Keras 3 (TensorFlow 2.16 or later); this TensorFlow brings Keras 2",
)

from dtensor_vs_mirrored.shared.errors import UsageError  # noqa: E402 - after the skip: these need Keras 3
from dtensor_vs_mirrored.shared.model.definition import Model  # noqa: E402
from dtensor_vs_mirrored.shared.model.keras_layers import Dropout  # noqa: E402
from dtensor_vs_mirrored.shared.model.registry import load, random_ops, register  # noqa: E402
from dtensor_vs_mirrored.shared.report.document import model_facts  # noqa: E402
from dtensor_vs_mirrored.shared.report.schema import SCHEMA_PATH  # noqa: E402
from tests.cli import run_here  # noqa: E402

CNN = "examples/keras_cnn.py:keras_cnn"
MISTAKES = "tests/models/keras_mistakes.py"
with open(SCHEMA_PATH) as _file:
    SCHEMA = json.load(_file)


def test_a_keras_model_is_its_variables_by_path_laid_out_by_its_layout_map():
    definition = load(CNN)
    layouts = {variable.name: variable.layout for variable in definition.variables}
    assert list(layouts) == [
        "conv/kernel",
        "conv/bias",
        "bn/gamma",
        "bn/beta",
        "dense/kernel",
        "dense/bias",
        "out/kernel",
        "out/bias",
        "bn/moving_mean",
        "bn/moving_variance",
    ]  # the seed state of the Dropout is none of them: a step's is drawn from the step
    assert layouts["dense/kernel"] == ("unsharded", "model") and layouts["dense/bias"] == ("model",)
    assert layouts["out/kernel"] == ("model", "unsharded") and layouts["conv/kernel"] == ()
    assert [v.name for v in definition.variables if not v.trainable] == ["bn/moving_mean", "bn/moving_variance"]
    assert (definition.input_shape, definition.input_dtype, definition.label_shape, definition.classes) == (
        (32, 32, 3),
        "float32",
        (),
        10,
    )
    assert definition.parameter_count() == 13_162  # Keras's count_params() plus the 16 moving statistics
    assert [caution.trainers for caution in definition.cautions] == [("mirrored",)]
    assert definition.cautions[0].text.startswith("bn: Keras BatchNormalization without synchronized=True")
    facts = model_facts(definition)  # the JSON report's model, as the schema says
    jsonschema.validate(facts, {"$defs": SCHEMA["$defs"], **SCHEMA["properties"]["model"]})
    assert facts["cautions"] == [{"trainers": ["mirrored"], "text": definition.cautions[0].text}]


def test_the_function_is_called_after_the_runs_seed_is_set_and_names_its_layers_alike_every_time():
    build = load.__wrapped__  # past the cache: the user's function is called each time
    first, again, other = (build(f"{MISTAKES}:subclassed", None, 0.0, seed) for seed in (5, 5, 6))
    assert first.names == again.names == other.names == ["subclassed/dense/kernel", *first.names[1:]]
    for one, two in zip(first.initial_values(0), again.initial_values(0), strict=True):
        np.testing.assert_array_equal(one, two)
    assert not np.array_equal(first.initial_values(0)[0], other.initial_values(0)[0])


def test_check_model_takes_a_function_returning_a_keras_model_and_its_layout_map():
    from examples.keras_transformer import transformer

    definition = load(register(transformer, "transformer", seed=22))
    assert definition.name == "keras transformer_block 9802 parameters"
    split = [variable.name for variable in definition.variables if "model" in variable.layout]
    assert split == [
        "mha/query/kernel",
        "mha/query/bias",
        "mha/key/kernel",
        "mha/key/bias",
        "mha/value/kernel",
        "mha/value/bias",
        "mha/attention_output/kernel",
        "up/kernel",
        "up/bias",
        "down/kernel",
    ]


def test_a_float64_run_computes_in_float64_end_to_end_from_the_float32_values_widened():
    """The definition's float64 forward against the same model built in float64 by Keras itself, from the same
    values: equal to rounding; the float32 forward is float32's distance away."""
    definition = load("examples/keras_transformer.py:transformer")
    values = definition.initial_values(0)
    images = np.random.default_rng(0).uniform(size=(4, 28, 28)).astype(np.float32)
    float64 = Model(definition, [value.astype(np.float64) for value in values])(tf.constant(images))
    float32 = Model(definition, values)(tf.constant(images))
    keras.config.set_dtype_policy("float64")
    try:
        from examples.keras_transformer import transformer

        native, _ = transformer()
    finally:
        keras.config.set_dtype_policy("float32")
    trainable = len(native.trainable_variables)
    for variable, value in zip(native.trainable_variables, values[:trainable], strict=True):
        variable.assign(value.astype(np.float64))
    expected = native(images.astype(np.float64)).numpy()
    assert float64.dtype == tf.float64 and native.variables[0].dtype == "float64"
    np.testing.assert_allclose(float64.numpy(), expected, rtol=0, atol=1e-13)
    assert 1e-9 < np.max(np.abs(float32.numpy() - expected)) < 1e-5


def test_the_trained_model_saves_as_a_keras_file_that_predicts_as_the_tools_forward(tmp_path):
    definition = load("examples/keras_cnn.py:synchronized")
    rng = np.random.default_rng(1)
    values = [value + rng.normal(0, 0.01, value.shape).astype(np.float32) for value in definition.initial_values(0)]
    path = str(tmp_path / "model.keras")
    definition.save_as(values, path)
    loaded = keras.saving.load_model(path)
    images = rng.uniform(size=(8, 32, 32, 3)).astype(np.float32)
    expected = Model(definition, values)(tf.constant(images)).numpy()
    np.testing.assert_allclose(loaded.predict(images, verbose=0), expected, rtol=0, atol=1e-6)
    assert type(loaded.get_layer("drop")) is keras.layers.Dropout  # plain Keras: no import of this project needed
    np.testing.assert_array_equal(loaded.get_layer("bn").moving_mean.numpy(), values[-2])


def test_the_drop_in_dropout_is_kerass_outside_the_tool_and_names_no_random_op_inside():
    layer = Dropout(0.5, seed=3)
    ones = np.ones((4, 100), np.float32)
    dropped = layer(ones, training=True).numpy()
    assert set(np.unique(dropped)) == {0.0, 2.0} and np.array_equal(layer(ones, training=False), ones)
    assert random_ops(load("examples/keras_cnn.py:synchronized")) == []
    assert load("examples/keras_cnn.py:keras_dropout").cautions[-1].random
    with pytest.raises(ValueError, match="give no noise_shape"):
        Dropout(0.5, noise_shape=(None, 1))


BAD = {
    "never_called": r"the Keras model subclassed is not built; start it with keras.Input\(shape\), or call it once "
    r"on an example batch$",
    "two_outputs": r"the model returns list of 2 outputs; it must return one tensor of logits \[N, ..., classes\]$",
    "data_axis": r"LayoutMap key 'hidden/kernel' names the axis 'data'; a mesh here has the axes 'batch' and 'model' "
    r"\(None: unsharded\)$",
    "wrong_rank": r"LayoutMap key 'hidden/kernel' gives hidden/kernel \('model',\), 1 entries for its shape of rank 2 "
    r"\[784, 16\]; give one entry per dimension$",
    "two_keys": r"variable hidden/kernel matches more than one LayoutMap key \(\['hidden/\.\*', '\.\*/kernel'\]\); "
    r"make each variable's path match one key$",
    "float16": r"variable hidden/kernel is float16; build the model in float32 \(--dtype float64 trains a float64 copy "
    r"of it\)$",
    "two_mixed_policies": r"layers hidden and out compute under mixed_bfloat16 and mixed_float16; give every mixed "
    r"layer one policy$",
    "float16_policy": r"layer out has the dtype policy float16; the tool trains float32 weights computing in float32 "
    r"or under mixed_bfloat16 or mixed_float16: use one of those$",
    "not_a_model": r"returned a Dense; return a keras.Model$",
    "tokens_without_embedding": r"the model takes int32 inputs but has no Embedding layer to say how many token ids it "
    r"takes; embed the ids with keras.layers.Embedding, or take float inputs$",
}


def test_a_model_of_two_inputs_takes_one_array_per_input_named_as_keras_named_them():
    """Refused before issue 59; its data is x_train_<name> and x_test_<name> for each (tests/test_keras_inputs.py)."""
    definition = load(f"{MISTAKES}:two_inputs")
    assert [(named.name, named.shape, named.dtype) for named in definition.inputs] == [
        ("input_layer", (392,), "float32"),
        ("input_layer_1", (392,), "float32"),
    ]


def test_a_token_models_vocabulary_is_its_embeddings():
    """Data is checked against it before anything trains (a token beyond it fails inside every trainer)."""
    definition = load(f"{MISTAKES}:embedded_tokens")
    assert (definition.input_dtype, definition.vocabulary, definition.label_shape) == ("int32", 65, (16,))


def test_a_keras_language_model_trains_on_the_shipped_tiny_shakespeare_and_matches_one_device_in_float64():
    """Token ids in, a label for every position out: --data embedded gives it tiny Shakespeare's windows (each
    [N, T] int32 of 65 characters, labels the next character), not MNIST's images, which it cannot take."""
    from dtensor_vs_mirrored.shared.api import check_model
    from dtensor_vs_mirrored.shared.config import Config
    from dtensor_vs_mirrored.shared.training.data import load_run_data

    model = f"{MISTAKES}:embedded_tokens"
    assert load(model).default_data == "tiny_shakespeare"
    data = load_run_data(Config(model=model, data="embedded", train_examples=64, test_examples=32, batch_size=32))
    assert data.x_train.shape == data.y_train.shape == (64, 16) and data.x_train.dtype == np.int32
    assert data.reason.startswith("tiny Shakespeare") and data.x_train.max() < 65
    np.testing.assert_array_equal(data.x_train[:, 1:], data.y_train[:, :-1])  # the next character
    check = check_model(
        model, meshes=["batch=2"], devices=2, dtype="float64", train_examples=64, test_examples=32, epochs=1,
        batch_size=32,
    )  # fmt: skip
    assert check.ok, check.summary()
    assert check.parity["dtensor batch=2"].max_rel_loss_diff <= 1e-12


@pytest.mark.parametrize("name", BAD)
def test_a_keras_model_no_trainer_could_train_is_one_line(name):
    with pytest.raises(UsageError, match=rf"^--model {MISTAKES}:{name}: {BAD[name]}"):
        load(f"{MISTAKES}:{name}")


@pytest.mark.parametrize(
    "model, key",
    [(f"{MISTAKES}:indivisible", "out/kernel"), ("tests/models/keras_layouts.py:indivisible_by_pattern", "out/k.*")],
)
def test_from_the_command_line_a_dimension_the_model_axis_cannot_split_is_exit_2_naming_the_key(model, key):
    result = run_here("--model", model, "--data", "embedded", "--devices", "4", "--mesh", "batch=1,model=4")
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "variable out/kernel dimension 1 (10) does not divide over the model axis of 4, and the model allows no "
            f"padding for it; use a model axis of 1, 2, 5, 10, or None for dimension 1 in LayoutMap key '{key}'"
        )
    )


def test_a_softmax_output_is_said_before_anything_trains_and_a_regularizer_trains():
    (caution,) = load(f"{MISTAKES}:softmax_output").cautions
    assert caution.trainers == () and caution.text.startswith("probabilities: the model's output is a softmax")
    regularized = load(f"{MISTAKES}:regularized")  # every trainer adds its penalty (tests/test_keras_objective.py)
    assert regularized.cautions == ()
    assert regularized.objective.endswith("plus the model's own losses, once a step: 1 weight regularizer")


@pytest.mark.extended
def test_a_keras_file_from_a_dtensor_model_axis_run_predicts_as_the_export_in_a_fresh_process(tmp_path):
    """Done-when of issue 38: DTensor batch=2,model=4, the Transformer block; keras.saving.load_model in a new
    process, its logits against the SavedModel's on the export's probe inputs."""
    export = tmp_path / "export"
    result = run_here(
        "--model", "examples/keras_transformer.py:transformer", "--data", "embedded", "--devices", "8", "--mesh",
        "batch=2,model=4", "--train-examples", "256", "--test-examples", "128", "--batch-size", "64", "--epochs",
        "1", "--trainers", "reference,dtensor", "--export", str(export), "--trainer-process", "shared",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    check = (
        "import sys, keras, numpy as np, tensorflow as tf\n"
        "directory = sys.argv[1]\n"
        "probe = np.load(directory + '/assets.extra/probe.npz')\n"
        "served = tf.saved_model.load(directory).signatures['serving_default'](images=tf.constant(probe['inputs']))\n"
        "loaded = keras.saving.load_model(directory + '/model.keras').predict(probe['inputs'], verbose=0)\n"
        "print(float(np.max(np.abs(loaded - served['logits'].numpy()))), len(probe['inputs']))\n"
    )
    fresh = subprocess.run(
        [sys.executable, "-c", check, str(export / "dtensor")], capture_output=True, text=True, timeout=300,
        cwd=str(tmp_path), env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    difference, examples = fresh.stdout.split()
    assert float(difference) <= 1e-6 and int(examples) == 100
