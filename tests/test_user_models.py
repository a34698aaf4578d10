"""A user's own model and data: their arrays from an .npz checked against the model's spec, the mistakes a new
user makes each one line (exit 2), a loss that averages over the examples it sees (MISMATCH at step 0 under
MirroredStrategy), and a forward that kills its DTensor process while the other trainers finish.

The user models are tests/models/user_mistakes.py; the CNN on 32x32x3 images from an .npz: examples/.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.model.registry import load
from dtensor_vs_mirrored.shared.training.data import load_data
from tests.cli import ROOT, run_compare, run_here, unwrapped

MISTAKES = "tests/models/user_mistakes.py"
CNN = load("examples/cnn_images.py:cnn")


def write(path, **changes):
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.uniform(size=(40, 32, 32, 3)).astype(np.float32),
        "y_train": rng.integers(0, 10, 40),
        "x_test": rng.uniform(size=(8, 32, 32, 3)).astype(np.float32),
        "y_test": rng.integers(0, 10, 8),
    }
    arrays.update(changes)
    np.savez(path, **{key: value for key, value in arrays.items() if value is not None})
    return str(path)


def test_an_npz_of_the_models_spec_loads_as_it_is(tmp_path):
    path = write(tmp_path / "images.npz")
    data = load_data(path, 32, None, CNN)
    assert data.x_train.shape == (32, 32, 32, 3) and data.x_test.shape == (8, 32, 32, 3)
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int64
    np.testing.assert_array_equal(data.x_train, np.load(path)["x_train"][:32])


BAD = {
    "missing key": (dict(y_test=None), r"no array y_test; the file holds x_train, y_train, x_test and needs"),
    "input shape": (
        dict(x_train=np.zeros((40, 28, 28, 1), np.float32)),
        r"x_train has shape \[40, 28, 28, 1\]; the model takes \[N, 32, 32, 3\]",
    ),
    "input dtype": (
        dict(x_test=np.zeros((8, 32, 32, 3), np.uint8)),
        r"x_test is uint8; the model takes float inputs: scale and cast them",
    ),
    "label shape": (
        dict(y_train=np.zeros((40, 2), np.int64)),
        r"y_train has shape \[40, 2\]; the model's labels are \[N\]",
    ),
    "label range": (
        dict(y_test=np.array([0, 1, 2, 10, 3, 4, 5, 6])),
        r"y_test holds label 10 \(example 3\); the model has 10 classes, 0-9",
    ),
    "nan": (
        dict(x_train=np.where(np.arange(40)[:, None, None, None] == 5, np.nan, np.ones((40, 32, 32, 3), np.float32))),
        r"x_train holds NaN or inf, first in example 5",
    ),
    "lengths": (dict(y_train=np.zeros(39, np.int64)), r"x_train has 40 examples but y_train has 39"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_arrays_are_one_line_naming_the_array(tmp_path, case):
    changes, message = BAD[case]
    with pytest.raises(UsageError, match=message):
        load_data(write(tmp_path / "bad.npz", **changes), None, None, CNN)


def test_bad_data_from_the_command_line_is_one_line_exit_2(tmp_path):
    path = write(tmp_path / "images.npz")
    result = run_here("--model", "examples/cnn_images.py:cnn", "--data", path, "--batch-size", "64")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"compare.py: error: --data {path}: 40 training examples are fewer than one global batch of 64; "
        f"use --batch-size 40 or more data"
    )


def test_mnist_for_a_model_that_takes_other_inputs_says_to_give_its_data():
    with pytest.raises(UsageError, match=r"takes inputs \[32, 32, 3\] float32 .* give its data with --data FILE.npz"):
        load_data("embedded", 64, 16, CNN)


@pytest.mark.parametrize(
    "name, message",
    [
        ("leftover_variable", r"variable unused gets no gradient from the forward \(unused, or updated by assign\)"),
        (
            "wrong_input_shape",
            r"its forward raised InvalidArgumentError: Matrix size-incompatible: .* \(user_mistakes.py:\d+\) "
            r"on inputs \[2, 784\] float32$",
        ),
    ],
)
def test_a_model_no_trainer_could_train_is_one_line_naming_the_variable_or_its_line(name, message):
    with pytest.raises(UsageError, match=message):
        load(f"{MISTAKES}:{name}")


USER_SNIPPET = """
from dtensor_vs_mirrored.shared.api import check_model
from tests.models.user_mistakes import local_mean_loss
result = check_model(local_mean_loss, meshes=("batch=2",), devices=2, dtype="float64", epochs=1,
                     train_examples=128, test_examples=64, batch_size=64)
print(result.summary())
reference, mirrored = (result.run.results[name].history.step_losses[0] for name in ("reference", "mirrored"))
print(f"first losses {reference!r} {mirrored!r}")
"""


# extended: the same mistake under MirroredStrategy is test_mirrored.py's per-replica loss scaling, and
# check_model on a user's model file runs in test_randomness.py by default.
@pytest.mark.extended
def test_a_loss_averaged_over_the_local_batch_is_a_mismatch_at_step_0_under_mirrored_strategy():
    """tensorflow/tensorflow#55321's mistake in a per-label loss: each replica divides by the 32 examples it sees,
    so its loss and gradients are twice the reference's from the first step. DTensor's forward sees the global
    batch (one program for the whole mesh), so the same loss matches there. float64: nothing but the mistake.
    As a user's test would: a fresh process from the repository's root, the model given as a function."""
    result = subprocess.run(
        [sys.executable, "-c", USER_SNIPPET],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[1:3] == [
        "dtensor batch=2: ok",
        "mirrored: MISMATCH at step 0: loss, first-step gradients; after its update every variable and Adam slot",
    ], result.stdout
    reference, mirrored = map(float, lines[3].split()[2:])
    assert mirrored == pytest.approx(2 * reference, rel=1e-12)


# A trainer that fails while the others still run: tests/test_compare.py, in one process; trainer processes: its
# full run.
@pytest.mark.extended
def test_a_forward_that_kills_its_dtensor_process_leaves_the_other_trainers_their_results():
    """`w[None]` on a replicated DVariable in a traced function kills the process (SIGSEGV, TF 2.21): in its own
    trainer process (the default on CPUs), that trainer is FAILED with what it was doing, the others finish, exit 1."""
    result = run_compare(
        "--model",
        f"{MISTAKES}:newaxis",
        "--data",
        "embedded",
        "--train-examples",
        "128",
        "--test-examples",
        "64",
        "--batch-size",
        "64",
        "--epochs",
        "1",
        "--devices",
        "2",
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    killed = (
        "its process was killed by SIGSEGV while dtensor on mesh batch=2 over 2 x CPU: tracing the train step, epoch 1"
    )
    assert killed in unwrapped(result.stdout)
    results = result.stdout.split("Results after the last epoch", 1)[1]
    assert [line.split("|")[1].strip() for line in results.splitlines()[3:6]] == ["reference", "dtensor", "mirrored"]
    rows = {line.split("|")[1].strip(): line for line in results.splitlines()[3:6]}
    assert "2 replicas on CPU" in rows["mirrored"] and "1 x CPU" in rows["reference"]
