"""Keras models of several named inputs (tests/models/keras_inputs.py): token ids and a 0/1 padding mask as a
keras-hub backbone takes them, two float inputs of other shapes; each input one array of an .npz, x_train_<name> and
x_test_<name>, checked as one input is and split over the batch axis on every trainer (shared/model/keras_inputs.py,
shared/training/npz_inputs.py, shared/training/batch_inputs.py)."""

import numpy as np
import pytest
import tensorflow as tf

keras = pytest.importorskip("keras", minversion="3", reason="Keras models need Keras 3")

from dtensor_vs_mirrored.shared.api import check_model  # noqa: E402 - after the skip: these need Keras 3
from dtensor_vs_mirrored.shared.config import Config  # noqa: E402
from dtensor_vs_mirrored.shared.errors import UsageError  # noqa: E402
from dtensor_vs_mirrored.shared.model.definition import Model  # noqa: E402
from dtensor_vs_mirrored.shared.model.forward import ForwardContext  # noqa: E402
from dtensor_vs_mirrored.shared.model.named_inputs import NamedInput, example_batch  # noqa: E402
from dtensor_vs_mirrored.shared.model.registry import load  # noqa: E402
from dtensor_vs_mirrored.shared.training.data import load_run_data  # noqa: E402
from tests.cli import run_here  # noqa: E402
from tests.models.keras_inputs import LENGTH, VOCABULARY, write_floats, write_tokens  # noqa: E402

MODELS = "tests/models/keras_inputs.py"
# 290 examples in batches of 64: the last batch of 34 pads to 36 on DTensor's batch axis of 4 (2 of 2) and goes in
# pieces of 9, 9, 8, 8 to MirroredStrategy's 4 replicas.
FLOAT64 = dict(dtype="float64", epochs=1, batch_size=64, train_examples=290, test_examples=96)


def test_a_model_of_named_inputs_is_each_inputs_shape_dtype_and_the_vocabulary_of_the_embedding_it_feeds():
    tokens = load(f"{MODELS}:masked_tokens")
    assert tokens.inputs == (
        NamedInput("token_ids", (LENGTH,), "int32", VOCABULARY),
        NamedInput("padding_mask", (LENGTH,), "int32", None),  # a mask feeds no Embedding: no token range
    )
    assert tokens.description.endswith("inputs token_ids [8] int32 (vocabulary 50), padding_mask [8] int32")
    floats = load(f"{MODELS}:two_floats")  # a list of Inputs: named by each Input's name
    assert floats.inputs == (NamedInput("image", (6, 6, 1), "float32"), NamedInput("features", (5,), "float32"))


@pytest.mark.parametrize("model", ["segments_inside", "segments_inside_one_input"])
def test_token_ids_are_bounded_by_the_embedding_they_reach_directly_not_one_of_ids_computed_from_them(model):
    """A keras-hub BERT's segment ids made inside as zeros_like(token_ids) reach its segment Embedding of 2: the
    token ids' range is the token Embedding's 50 (2 refused every real token before)."""
    definition = load(f"{MODELS}:{model}")
    vocabularies = [named.vocabulary for named in definition.inputs] or [definition.vocabulary]
    assert vocabularies[0] == VOCABULARY


# extended: every trainer and mesh on named inputs is the default's two-floats-and-backbone test's path too.
@pytest.mark.extended
def test_token_ids_and_a_padding_mask_match_one_device_in_float64_on_every_trainer_and_mesh(tmp_path):
    """The hidden layer split on the model axis by its LayoutMap on batch=2,model=2."""
    data = write_tokens(tmp_path / "tokens.npz")
    result = check_model(
        f"{MODELS}:masked_tokens_split", meshes=("batch=4", "batch=2,model=2"), devices=4, data=data, **FLOAT64
    )
    assert result.ok, result.summary()
    assert set(result.verdicts) == {"dtensor batch=4", "dtensor batch=2,model=2", "mirrored"}
    for parity in result.parity.values():
        assert parity.max_abs_loss_diff <= 1e-12 and parity.max_abs_weight_diff <= 1e-12, result.summary()


@pytest.mark.extended  # DTensorDataset's input: tests/test_dtensor.py; named inputs by pack: below
def test_dtensor_dataset_input_lays_out_each_named_input_on_the_batch_axis(tmp_path):
    """--dtensor-input dataset: DTensorDataset takes a dict of layouts, one per input; the remainder batch packed."""
    data = write_tokens(tmp_path / "tokens.npz")
    result = check_model(
        f"{MODELS}:masked_tokens", trainers=("dtensor",), meshes=("batch=8",), devices=8, data=data,
        dtensor_input="dataset", **FLOAT64,
    )  # fmt: skip
    assert result.ok, result.summary()
    assert result.parity["dtensor batch=8"].max_abs_loss_diff <= 1e-12


@pytest.mark.parametrize(
    "model, write, mesh",
    [
        pytest.param("two_floats", write_floats, "batch=4", marks=pytest.mark.extended),  # two inputs: the next
        ("backbone_with_head", write_tokens, "batch=2,model=2"),
    ],
)
def test_two_float_inputs_and_a_backbone_of_two_inputs_under_a_head_match_one_device_in_float64(
    tmp_path, model, write, mesh
):
    result = check_model(f"{MODELS}:{model}", devices=4, meshes=(mesh,), data=write(tmp_path / "data.npz"), **FLOAT64)
    assert result.ok, result.summary()
    assert max(parity.max_abs_loss_diff for parity in result.parity.values()) <= 1e-12, result.summary()


def test_a_backbone_of_two_inputs_under_a_head_is_tapped_inside_and_its_mask_is_no_token_input():
    """The backbone is called with the dict: its graph is run call by call (its layers' taps under its name), and
    the mask that it takes beside the token ids reaches no Embedding inside it."""
    definition = load(f"{MODELS}:backbone_with_head")
    assert [named.vocabulary for named in definition.inputs] == [VOCABULARY, None]
    model = Model(definition, definition.initial_values(0))
    context = ForwardContext(training=True, step=tf.constant(0, tf.int64), record=True)
    logits = model(example_batch(definition, 3), context)
    taps = [name for name, _ in context.taps]
    assert taps[-3:] == ["backbone/dense", "backbone", "head"] and "backbone/embed" in taps
    np.testing.assert_array_equal(logits, model(example_batch(definition, 3), ForwardContext(training=True)))


def test_a_first_difference_is_named_from_each_trainers_taps_of_a_model_of_two_inputs(tmp_path):
    """Keras's own Dropout draws other units on DTensor and MirroredStrategy: the replay taps every trainer's
    forward on the named inputs and names the Dropout."""
    result = check_model(
        f"{MODELS}:two_floats_dropout", devices=2, meshes=("batch=2",), data=write_floats(tmp_path / "f.npz"),
        **{**FLOAT64, "train_examples": 128},
    )  # fmt: skip
    for name in ("dtensor batch=2", "mirrored"):
        verdict = result.verdicts[name]
        assert verdict.verdict == "MISMATCH" and verdict.first_difference.tap == "drop", result.summary()
        assert verdict.first_difference.agreed[-2:] == ["feature_dense", "concatenate"]


@pytest.mark.parametrize("model, write", [("masked_tokens", write_tokens), ("two_floats", write_floats)])
def test_keras_fit_trains_a_model_of_two_inputs_as_the_reference_does(tmp_path, model, write):
    """A dict of Inputs, and a list of them (given to Keras as a tuple in its order)."""
    data = write(tmp_path / "data.npz")
    result = check_model(f"{MODELS}:{model}", fit=True, devices=2, data=data, **{**FLOAT64, "train_examples": 256})
    assert result.ok, result.summary()
    assert result.parity["mirrored"].max_abs_loss_diff <= 1e-12


def loaded(path, model="masked_tokens"):
    return load_run_data(Config(model=f"{MODELS}:{model}", data=str(path), batch_size=64))


def test_each_input_is_its_own_array_of_the_npz(tmp_path):
    data = loaded(write_tokens(tmp_path / "tokens.npz"))
    assert sorted(data.x_train) == ["padding_mask", "token_ids"] and len(data.y_train) == 290
    assert data.x_test["token_ids"].shape == data.x_test["padding_mask"].shape == (96, LENGTH)
    mask = data.x_train["padding_mask"]
    assert mask.dtype == np.int32 and set(np.unique(mask)) == {0, 1}
    as_bool = loaded(write_tokens(tmp_path / "bool.npz", x_train_padding_mask=mask.astype(bool)))
    np.testing.assert_array_equal(as_bool.x_train["padding_mask"], mask)  # a bool mask is taken as 0/1 int32
    assert as_bool.x_train["padding_mask"].dtype == np.int32


OUT_OF_RANGE = np.full((290, LENGTH), 3, np.int32)
OUT_OF_RANGE[7, 2] = VOCABULARY
BAD = {
    "missing": (
        dict(x_test_padding_mask=None),
        "no array x_test_padding_mask; the file holds x_train_token_ids, x_train_padding_mask, y_train, "
        "x_test_token_ids, y_test and needs x_train_token_ids, x_train_padding_mask, x_test_token_ids, "
        "x_test_padding_mask, y_train, y_test (one array per input of the model: token_ids, padding_mask)",
    ),
    "first_dimension": (
        dict(x_train_padding_mask=np.ones((200, LENGTH), np.int32)),
        "x_train_padding_mask has 200 examples but y_train has 290; give every input of the split one example per "
        "label, on its first axis",
    ),
    "shape": (
        dict(x_test_token_ids=np.zeros((96, LENGTH + 1), np.int32)),
        "x_test_token_ids has shape [96, 9]; the model takes [N, 8] (keras functional 1476 parameters)",
    ),
    "token_range": (
        dict(x_train_token_ids=OUT_OF_RANGE),
        "x_train_token_ids holds token 50 (example 7); the model's vocabulary is 50 tokens, 0-49",
    ),
    "mask_dtype": (
        dict(x_train_padding_mask=np.ones((290, LENGTH), np.float32)),
        "x_train_padding_mask is float32; the model's input padding_mask takes int32",
    ),
}


@pytest.mark.parametrize("name", BAD)
def test_each_array_that_does_not_fit_its_input_is_one_line_naming_it(tmp_path, name):
    replaced, message = BAD[name]
    path = write_tokens(tmp_path / "tokens.npz", **replaced)
    with pytest.raises(UsageError) as raised:
        loaded(path)
    assert str(raised.value) == f"--data {path}: {message}"


def test_a_model_of_two_inputs_given_one_x_train_or_mnist_is_told_which_arrays_it_needs(tmp_path):
    single = tmp_path / "single.npz"
    np.savez(
        single, x_train=np.zeros((64, 8)), y_train=np.zeros(64, int), x_test=np.zeros((8, 8)), y_test=np.zeros(8, int)
    )
    with pytest.raises(
        UsageError,
        match=r"no array x_train_token_ids; the file holds x_train, y_train, x_test, y_test and needs "
        r"x_train_token_ids, ",
    ):
        loaded(single)
    result = run_here("--model", f"{MODELS}:masked_tokens", "--data", "embedded")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "compare.py: error: --data embedded: the model takes 2 inputs, which only an .npz gives; use --data FILE.npz "
        "holding x_train_token_ids, x_train_padding_mask, x_test_token_ids, x_test_padding_mask, y_train, y_test "
        "(one array per input of the model: token_ids, padding_mask) (docs/data.md)"
    )
