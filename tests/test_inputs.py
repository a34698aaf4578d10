"""Inputs checked before anything trains, each one line (UsageError; exit 2 from compare.py): tokens outside the
model's vocabulary, a split or a global batch without a label that counts, a file that is not an .npz of numbers,
an --export target that is not an earlier export; and what is taken as it is: a float64 .npz stays float64 in a
float64 run (a float32 run narrows it and says so), a --model file imports its siblings. A few seconds, most of
them the float64 run of every trainer."""

import os
import pickle
import sys

import numpy as np
import pytest

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.model.definition import ModelDefinition, Variable, check_definition
from dtensor_vs_mirrored.shared.model.gpt import CONTEXT, VOCABULARY
from dtensor_vs_mirrored.shared.model.registry import load
from dtensor_vs_mirrored.shared.training.data import load_data, load_run_data
from dtensor_vs_mirrored.shared.training.export import PROBE_FILE, check_targets
from tests.cli import SMALL, run_here

GPT = load("gpt")


def tokens_npz(path, **changes):
    """A GPT's data: 64 windows of tokens and their next tokens, 16 to test."""
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, len(VOCABULARY), (64, CONTEXT)).astype(np.int32),
        "y_train": rng.integers(0, len(VOCABULARY), (64, CONTEXT)),
        "x_test": rng.integers(0, len(VOCABULARY), (16, CONTEXT)).astype(np.int32),
        "y_test": rng.integers(0, len(VOCABULARY), (16, CONTEXT)),
    }
    arrays.update(changes)
    np.savez(path, **arrays)
    return str(path)


def images_npz(path, dtype, examples=(128, 64)):
    """MNIST-shaped float inputs of `dtype` with labels 0-9."""
    rng = np.random.default_rng(1)
    arrays = {}
    for split, count in zip(("train", "test"), examples):
        arrays[f"x_{split}"] = rng.uniform(size=(count, 784)).astype(dtype)
        arrays[f"y_{split}"] = rng.integers(0, 10, count)
    np.savez(path, **arrays)
    return str(path)


def test_the_gpt_declares_its_vocabulary_and_a_token_model_must():
    assert GPT.vocabulary == len(VOCABULARY) == 65
    no_vocabulary = ModelDefinition("tokens", (Variable("w", (8, 4)),), lambda v, x: x, 1, input_dtype="int32")
    with pytest.raises(UsageError) as raised:
        check_definition(no_vocabulary, "mine.py:tokens")
    assert str(raised.value) == (
        "--model mine.py:tokens: input_dtype int32 with vocabulary None: integer inputs are token ids; declare "
        "vocabulary=N, the number of ids (0..N-1) the model takes"
    )


@pytest.mark.parametrize("token, where", [(65, "x_train"), (-1, "x_test")])
def test_a_token_outside_the_vocabulary_is_one_line(tmp_path, token, where):
    rng = np.random.default_rng(0)
    count = 64 if where == "x_train" else 16
    tokens = rng.integers(0, 65, (count, CONTEXT)).astype(np.int32)
    tokens[3, 10] = token
    path = tokens_npz(tmp_path / "tokens.npz", **{where: tokens})
    with pytest.raises(UsageError) as raised:
        load_data(path, None, None, GPT)
    assert str(raised.value) == (
        f"--data {path}: {where} holds token {token} (example 3); the model's vocabulary is 65 tokens, 0-64"
    )


def test_a_split_with_no_label_that_counts_is_one_line(tmp_path):
    path = tokens_npz(tmp_path / "masked.npz", y_test=np.full((16, CONTEXT), -1))
    with pytest.raises(UsageError) as raised:
        load_data(path, None, None, GPT)
    assert str(raised.value) == (
        f"--data {path}: no label of the 16 y_test examples used counts (each is negative), so its mean loss "
        f"would divide by zero; give the split labels 0-64"
    )


def test_a_global_batch_with_no_label_that_counts_is_one_line(tmp_path):
    labels = np.random.default_rng(0).integers(0, 65, (64, CONTEXT))
    labels[32:] = -1  # the second batch of 32 is all masked
    path = tokens_npz(tmp_path / "masked.npz", y_train=labels)
    config = Config(model="gpt", data=path, batch_size=32, epochs=1)
    with pytest.raises(UsageError) as raised:
        load_run_data(config)
    assert str(raised.value) == (
        f"--data {path}: global batch 1 of epoch 1 has no label that counts (each is negative), so its mean loss "
        f"would divide by zero; mix the masked examples with others, or use another --batch-size"
    )
    assert load_run_data(config.replace(batch_size=64)).y_train.shape == (64, CONTEXT)  # one batch: it counts


def test_a_float64_npz_stays_float64_in_a_float64_run_and_a_float32_run_says_it_narrows(tmp_path):
    path = images_npz(tmp_path / "float64.npz", np.float64)
    wide = load_data(path, None, None, load("mlp"), "float64")
    assert wide.x_train.dtype == np.float64 and wide.reason == "your arrays"
    np.testing.assert_array_equal(wide.x_train, np.load(path)["x_train"])
    narrow = load_data(path, None, None, load("mlp"), "float32")
    assert narrow.x_train.dtype == np.float32
    assert narrow.reason == "your arrays; float64 inputs narrowed to float32 for this float32 run"
    assert load_data(images_npz(tmp_path / "float32.npz", np.float32), None, None, load("mlp"), "float64").reason == (
        "your arrays"
    )


def test_every_trainer_trains_a_float64_npz_in_float64(tmp_path):
    path = images_npz(tmp_path / "float64.npz", np.float64)
    options = [*SMALL, "--data", path, "--train-examples", "128", "--test-examples", "64", "--hidden", "32"]
    result = run_here(*options, "--dtype", "float64")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"data: {path} (your arrays); 128 train, 64 test examples" in " ".join(result.stdout.split())
    assert result.stdout.rstrip().endswith("PARITY OK")


@pytest.mark.parametrize(
    "write, expected",
    [
        (lambda path: path.write_text("x_train,y_train\n1,2\n"), "not an .npz archive; write x_train, y_train, "),
        (lambda path: np.save(open(path, "wb"), np.zeros(3)), "one .npy array; write x_train, y_train, x_test, "),
        (lambda path: path.write_bytes(pickle.dumps({"x_train": 1})), "not an .npz archive; write x_train"),
        (
            lambda path: np.savez(
                path, x_train=np.array([{}], object), y_train=[0], x_test=np.zeros((1, 784)), y_test=[0]
            ),
            "x_train holds Python objects, not numbers; save it as a numeric array",
        ),
    ],
    ids=["text", "an .npy", "a pickle", "an object array"],
)
def test_a_file_that_is_not_an_npz_of_numbers_is_one_line_that_never_suggests_unpickling(tmp_path, write, expected):
    path = tmp_path / "data.npz"
    write(path)
    with pytest.raises(UsageError) as raised:
        load_data(str(path), None, None, load("mlp"))
    assert str(raised.value).startswith(f"--data {path}: {expected}")
    assert "pickle" not in str(raised.value)


def test_export_refuses_a_target_that_is_not_an_earlier_export_before_training(tmp_path):
    export = tmp_path / "exported"
    (export / "reference").mkdir(parents=True)
    (export / "reference" / "notes.txt").write_text("mine")
    result = run_here("--trainers", "reference", "--data", "embedded", "--export", export)
    assert result.returncode == 2 and "epoch 1/" not in result.stdout
    assert result.stderr.splitlines() == [
        f"compare.py: error: --export {export}: {export}/reference exists and is not an export of compare.py (it "
        f"has no {PROBE_FILE}), and the export would replace it; move it, or choose another directory"
    ]
    (export / "dtensor" / "assets.extra").mkdir(parents=True)  # an earlier export is replaced; an empty one taken
    np.savez(export / "dtensor" / PROBE_FILE, inputs=np.zeros(1))
    (export / "mirrored").mkdir()
    check_targets(str(export), ["dtensor", "mirrored", "new"])


SIBLING = """
import tensorflow as tf


def forward(v, images):
    return tf.matmul(images, v["w"])
"""
MODEL = """
from helpers_for_test_inputs import forward
from dtensor_vs_mirrored.shared.model.definition import ModelDefinition, Variable, truncated_normal


def model():
    return ModelDefinition("sibling", (Variable("w", (784, 10), truncated_normal(0.1, 1)),), forward, 1)
"""


def test_a_model_file_imports_its_siblings(tmp_path):
    (tmp_path / "helpers_for_test_inputs.py").write_text(SIBLING)
    (tmp_path / "mine.py").write_text(MODEL)
    before = list(sys.path)
    definition = load(f"{tmp_path / 'mine.py'}:model")
    assert definition.name == "sibling" and definition.forward.__module__ == "helpers_for_test_inputs"
    assert sys.path == before and str(tmp_path) not in sys.path
    assert os.path.isfile(sys.modules["helpers_for_test_inputs"].__file__)
