"""The character GPT on tiny Shakespeare (the shipped excerpt) through every trainer in float64: DTensor on a
tensor-parallel mesh with its weights split on the batch axis too (--shard-weights), MirroredStrategy
(extended), and the sharded run's checkpoint and export, whose serving signature takes tokens.

Data: the first 64 training and 32 test windows of 64 characters, global batch 32: 2 steps an epoch, 2 epochs.
Every position's next character is a label, so a step's loss is the mean over 32 x 64 = 2,048 tokens.
"""

import dataclasses
import re

import numpy as np
import pytest
import tensorflow as tf

from dtensor_vs_mirrored.dtensor_impl import gathering
from dtensor_vs_mirrored.dtensor_impl import spec as dtensor_spec
from dtensor_vs_mirrored.dtensor_impl.mesh import parse_mesh
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.judge.parity import check_parity
from dtensor_vs_mirrored.shared.model.gpt import CONTEXT, VOCABULARY, gpt
from dtensor_vs_mirrored.shared.training import checkpoint, export
from dtensor_vs_mirrored.shared.training.data import load_data
from dtensor_vs_mirrored.shared.training.registry import fit
from dtensor_vs_mirrored.shared.training.text import excerpt

MESH = "batch=2,model=2"
BASE = Config(model="gpt", data="embedded", epochs=2, batch_size=32, dtype="float64", quiet=True)
STEPS = 4
FLOAT64_BOUND = 1e-8  # measured: 1.3e-15 (docs/models.md)


@pytest.fixture(scope="module")
def data():
    return load_data("embedded", 64, 32, gpt())


@pytest.fixture(scope="module")
def runs(data, devices, tmp_path_factory):
    if dtensor_spec.tensorflow_release() < dtensor_spec.float64_collectives_since(parse_mesh(MESH, 8)):
        pytest.skip(f"this TensorFlow's DTensor collectives have no float64 on {MESH} (docs/releases.md)")
    directory = tmp_path_factory.mktemp("gpt")
    sharded = BASE.replace(
        mesh=MESH, devices=4, shard_weights=True, checkpoint_dir=str(directory / "ckpt"), export=str(directory / "x")
    )
    histories = {
        "reference": fit("reference", BASE, data, devices[:1]),
        "dtensor": fit("dtensor", sharded, data, devices[:4]),
    }
    return histories, directory


@pytest.fixture(scope="module")
def mirrored(data, devices):
    return fit("mirrored", BASE.replace(devices=2), data, devices[:2])


def test_the_windows_are_the_next_character_at_every_position(data):
    assert data.x_train.shape == (64, CONTEXT) and data.x_train.dtype == np.int32
    text = "".join(VOCABULARY[token] for token in data.x_train[0])
    assert text.startswith("First Citizen:")  # tiny Shakespeare's first line
    np.testing.assert_array_equal(data.y_train[0][:-1], data.x_train[0][1:])
    following = "".join(VOCABULARY[token] for token in [data.y_train[0][-1], *data.x_train[1]])
    assert excerpt()[0][: 2 * 65 - 1] == text + following  # consecutive windows of 65 characters


# MirroredStrategy runs any model's forward as given, per replica (users' models: tests/test_user_models.py).
@pytest.mark.parametrize("trainer", ["dtensor", pytest.param("mirrored", marks=pytest.mark.extended)])
def test_every_step_matches_the_reference_in_float64(runs, request, trainer):
    histories, _ = runs
    history = request.getfixturevalue("mirrored") if trainer == "mirrored" else histories[trainer]
    parity = check_parity(history, histories["reference"])
    assert parity.ok, parity.reason
    assert parity.steps == STEPS and parity.state_judged
    assert parity.max_abs_loss_diff <= FLOAT64_BOUND and parity.max_abs_grad_diff <= FLOAT64_BOUND
    if trainer == "dtensor":  # a model axis too: the weights read back on the host, not by a relayout
        assert history.details["all_gather"] == gathering.GATHER


def test_the_loss_is_the_mean_over_tokens(runs):
    """Small initial weights give every character about the same logit: the first loss is ln 65 per token
    (a loss summed over each window's 64 tokens would be 64 times that)."""
    histories, _ = runs
    assert abs(histories["reference"].step_losses[0] - np.log(len(VOCABULARY))) < 0.05
    assert histories["reference"].step_losses[-1] < histories["reference"].step_losses[0]


def test_the_sharded_checkpoint_and_the_export_hold_the_trained_model(runs):
    histories, directory = runs
    dtensor = histories["dtensor"]
    assert "token[unsharded,batch]" in dtensor.details["layouts"]  # 65 characters do not divide by 2: the width
    stored = checkpoint.weights_of(checkpoint.resolve(str(directory / "ckpt" / "dtensor")), gpt())
    for array, final in zip(stored, dtensor.final_weights, strict=True):
        np.testing.assert_array_equal(array, final)
    assert export.check_export(str(directory / "x" / "dtensor")) <= export.LOGIT_TOLERANCE
    signature = tf.saved_model.load(str(directory / "x" / "dtensor")).signatures["serving_default"]
    assert signature.structured_input_signature[1] == {"tokens": tf.TensorSpec([None, CONTEXT], tf.int32, "tokens")}
    assert dataclasses.asdict(dtensor.memory_per_device[0])["weight_bytes"] < 8 * gpt().parameter_count() / 2


def test_the_sharded_forward_all_gathers_the_weights_where_that_sends_fewer_bytes(runs):
    """DTensor's expansion would compute with the split weights by moving activations, which outweigh the GPT's
    weights: both forwards traced, the one that sends fewer bytes a step kept (the MLP keeps the expansion, with
    the bytes the run then sends: tests/test_sharding.py)."""
    dtensor = runs[0]["dtensor"]
    found = re.fullmatch(r"([\d.]+) MB a step against ([\d.]+) MB expanded", dtensor.details["weights_all_gathered"])
    assert found, dtensor.details["weights_all_gathered"]
    gathered, expanded = float(found[1]), float(found[2])
    print(f"\ngpt {MESH} sharded: {gathered} MB a step all-gathered, {expanded} MB expanded")
    assert gathered < expanded and "weights_expanded" not in dtensor.details
    assert dtensor.details["weights_all_gathered"] == f"{gathered:.2f} MB a step against {expanded:.2f} MB expanded"
