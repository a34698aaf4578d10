"""What docs/keras.md tells a Keras user who trains a language model, each checked: `--data embedded` gives a Keras
token model tiny Shakespeare's windows; windows written as an .npz (other text, the same way) train it too; pytest
comes with the `[test]` extra, not the plain install."""

import sys

import numpy as np
import pytest

keras = pytest.importorskip(
    "keras",
    minversion="3",
    reason="Keras models need Keras 3 (TensorFlow 2.16 or later); this TensorFlow brings Keras 2",
)

from dtensor_vs_mirrored.shared.api import check_model  # noqa: E402 - after the skip: these need Keras 3
from dtensor_vs_mirrored.shared.model.gpt import VOCABULARY  # noqa: E402
from dtensor_vs_mirrored.shared.model.registry import load  # noqa: E402
from dtensor_vs_mirrored.shared.training.data import load_data  # noqa: E402
from dtensor_vs_mirrored.shared.training.text import excerpt, windows  # noqa: E402
from tests.cli import ROOT  # noqa: E402

CHAR_LM = "tests/models/keras_layouts.py:char_lm"


def test_embedded_data_gives_a_keras_token_model_tiny_shakespeares_windows():
    data = load_data("embedded", 64, 64, load(CHAR_LM))
    assert data.x_train.shape == data.y_train.shape == (64, 64) and data.reason.startswith("tiny Shakespeare")


def test_the_docs_recipe_writes_tiny_shakespeare_as_an_npz_the_keras_model_trains_on(tmp_path):
    train_text, test_text = excerpt()
    x_train, y_train = windows(train_text, VOCABULARY, 64)
    x_test, y_test = windows(test_text, VOCABULARY, 64)
    assert (x_train.shape, x_train.dtype, y_train.dtype, x_test.shape) == ((3071, 64), np.int32, np.int64, (383, 64))
    assert np.array_equal(x_train[0, 1:], y_train[0, :-1])  # each label the next character
    path = tmp_path / "shakespeare.npz"
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    small = dict(devices=4, epochs=1, batch_size=32, train_examples=64, test_examples=32, trainer_process="shared")
    result = check_model(CHAR_LM, meshes=("batch=2,model=2",), trainers=("dtensor",), data=str(path), **small)
    assert result.ok, result.summary()
    assert len(result.run.results["reference"].history.step_losses) == 2


def test_pytest_comes_with_the_test_extra_not_the_plain_install():
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    with open(f"{ROOT}/pyproject.toml", "rb") as file:
        project = tomllib.load(file)["project"]
    named = lambda requirements: {r.split(">")[0].split("=")[0].split(";")[0].strip() for r in requirements}  # noqa: E731
    assert "pytest" not in named(project["dependencies"]) and "pytest" in named(
        project["optional-dependencies"]["test"]
    )
