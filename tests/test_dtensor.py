"""The DTensor trainer against the reference: parity on every mesh, the tutorial Adam's divergence, input modes.

Data: the first 301 training and 101 test embedded examples, global batch 64, 2
epochs: 10 steps whose last batch has 45 examples, an odd count, so it goes
through the zero-weight padding on every mesh whose batch axis is larger than 1.
Histories are cached per module, so each configuration trains once.
"""
import dataclasses
import os

import numpy as np
import pytest

from dtensor_impl import trainer as dtensor_trainer
from dtensor_impl.mesh import parse_mesh
from shared import reference
from shared.config import Config
from shared.parity import DEFAULT_TOLERANCE, check_parity

TRAIN_EXAMPLES, TEST_EXAMPLES = 301, 101
BASE = Config(epochs=2, batch_size=64, quiet=True)
STEPS = 2 * 5  # 4 batches of 64 and one of 45 per epoch
MESHES = ["batch=1", "batch=2", "batch=8", "batch=4,model=2", "batch=2,model=4"]
MULTI_DEVICE_MESHES = MESHES[1:]
PADDED_MESH = "batch=1,model=8"  # 700 does not divide by 8: padded to 704 with zero units


@pytest.fixture(scope="module")
def small(embedded):
    return dataclasses.replace(embedded, x_train=embedded.x_train[:TRAIN_EXAMPLES],
                               y_train=embedded.y_train[:TRAIN_EXAMPLES],
                               x_test=embedded.x_test[:TEST_EXAMPLES], y_test=embedded.y_test[:TEST_EXAMPLES])


@pytest.fixture(scope="module")
def run(devices, small):
    """run(trainer, **config changes) -> History, trained once per module and configuration."""
    histories = {}

    def run(trainer: str, **changes):
        config = BASE.replace(**changes)
        if trainer == "reference":
            config = config.replace(mesh=None, dtensor_input="pack")  # ignored by the reference
        if (trainer, config) not in histories:
            if trainer == "reference":
                histories[trainer, config] = reference.fit(config, small, devices[:1])
            else:
                mesh_devices = devices[:parse_mesh(config.mesh, len(devices)).device_count]
                histories[trainer, config] = dtensor_trainer.fit(config, small, mesh_devices)
        return histories[trainer, config]

    return run


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("mesh", MESHES + [PADDED_MESH])
def test_matches_the_reference_step_by_step(run, mesh, optimizer):
    history = run("dtensor", mesh=mesh, optimizer=optimizer)
    expected = run("reference", optimizer=optimizer)
    parity = check_parity(history, expected, DEFAULT_TOLERANCE)
    assert parity.ok, parity.reason
    assert len(history.step_losses) == STEPS
    assert parity.max_abs_loss_diff <= DEFAULT_TOLERANCE
    assert parity.max_abs_grad_diff <= DEFAULT_TOLERANCE
    assert parity.max_abs_weight_diff <= DEFAULT_TOLERANCE
    for record, expected_record in zip(history.epochs, expected.epochs, strict=True):
        assert abs(record.train_loss - expected_record.train_loss) <= DEFAULT_TOLERANCE
        assert abs(record.test_loss - expected_record.test_loss) <= DEFAULT_TOLERANCE
        assert abs(record.test_accuracy - expected_record.test_accuracy) <= 1 / TEST_EXAMPLES


def test_history_record_describes_the_run(run):
    history = run("dtensor", mesh="batch=4,model=2")
    assert history.trainer == "dtensor"
    assert history.placement == "mesh batch=4,model=2 over 8 x CPU"
    assert history.details["mesh"] == "batch=4,model=2"
    assert history.details["dtensor_input"] == "pack"
    assert history.details["layouts"] == ("w0[unsharded,model] b0[model] w1[model,unsharded] b1[unsharded] "
                                          "w2[unsharded,unsharded] b2[unsharded]")
    shapes = [(784, 700), (700,), (700, 500), (500,), (500, 10), (10,)]
    assert [w.shape for w in history.final_weights] == shapes
    assert [g.shape for g in history.first_step_gradients] == shapes
    assert all(isinstance(w, np.ndarray) and w.dtype == np.float32 for w in history.final_weights)
    assert [record.epoch for record in history.epochs] == [1, 2]
    assert history.trace_seconds > 0
    assert history.epochs[-1].train_loss < history.epochs[0].train_loss
    # Epoch 2 groups its 4 full batches as epoch 1 does (first alone, then 3), so nothing traces in it:
    # grouped 4 at once, it traced a new call shape inside the measured epoch.
    assert history.epochs[0].traces > 0 and history.epochs[1].traces == 0
    # Each of the 8 devices: half the first two layers (784x350, 350 and 350x500), all of the rest.
    per_device = 4 * (784 * 350 + 350 + 350 * 500 + 500 + 500 * 10 + 10)
    assert [(m.device, m.weight_bytes, m.optimizer_bytes) for m in history.memory_per_device] == \
        [(f"CPU:{i}", per_device, 2 * per_device + 8) for i in range(8)]


def test_padded_model_hands_out_the_unpadded_one(run):
    history = run("dtensor", mesh=PADDED_MESH)
    assert history.details["padding"] == "hidden 700 -> 704"
    assert "[unsharded,model]" in history.details["layouts"]
    shapes = [(784, 700), (700,), (700, 500), (500,), (500, 10), (10,)]
    assert [w.shape for w in history.final_weights] == shapes
    assert [g.shape for g in history.first_step_gradients] == shapes
    per_device = 4 * (784 * 88 + 88 + 88 * 500 + 500 + 500 * 10 + 10)  # 704 / 8 = 88 units, 4 of them padding
    assert {m.weight_bytes for m in history.memory_per_device} == {per_device}


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_padded_units_stay_exactly_zero(devices, small, optimizer):
    """Zero in, zero bias, zero out: ReLU gives 0 with gradient 0, so no update ever moves them."""
    from tensorflow.experimental import dtensor
    from dtensor_impl.mesh import create_mesh, padded_sizes
    from shared.model import initial_values, layer_sizes
    spec, sizes = parse_mesh(PADDED_MESH, 8), layer_sizes((60, 32))
    mesh = create_mesh(spec, devices)
    model = dtensor_trainer.build_model(
        dtensor_trainer.pad_values(initial_values(sizes, 22), padded_sizes(sizes, spec)), mesh)
    optimizer_state = dtensor_trainer.build_optimizer(BASE.replace(optimizer=optimizer, hidden=(60, 32)), model, mesh)
    batches = [dtensor_trainer.pack_batch(small.x_train[i:i + 64], small.y_train[i:i + 64], mesh)
               for i in range(0, 256, 64)]
    dtensor_trainer.train_steps(model, optimizer_state, batches)
    w0, b0, w1 = (dtensor_trainer.to_numpy(v) for v in model.weights[:3])
    assert w0.shape == (784, 64) and np.abs(w0[:, :60]).max() > 0
    assert not w0[:, 60:].any() and not b0[60:].any() and not w1[60:, :].any()
    if optimizer == "adam":
        for slot in (optimizer_state.m[0], optimizer_state.v[0]):
            assert dtensor_trainer.to_numpy(slot).any() and not dtensor_trainer.to_numpy(slot)[:, 60:].any()


@pytest.mark.parametrize("mesh", MULTI_DEVICE_MESHES)
def test_tutorial_adam_diverges_far_beyond_the_tolerance(run, mesh):
    """The tutorial's Python-float step count advances once per trace, and this run traces
    differently from the reference's (the padded final batch), so bias correction differs
    from step 5 on; the parity check must catch it. (Its stale slot reads need DTensor's
    all-reduce combining, which this trainer turns off on CPU: tests/test_compare.py.)"""
    history = run("dtensor", mesh=mesh, adam="tutorial")
    parity = check_parity(history, run("reference", adam="tutorial"), DEFAULT_TOLERANCE)
    assert not parity.ok
    assert parity.max_abs_grad_diff <= DEFAULT_TOLERANCE  # the forward and backward pass are right
    assert parity.max_abs_loss_diff > 100 * DEFAULT_TOLERANCE
    assert parity.max_abs_weight_diff > 5 * parity.weight_tolerance


def test_all_reduce_combining_is_off_on_cpu(run):
    run("dtensor", mesh="batch=2")
    assert os.environ[dtensor_trainer.COMBINE_ALL_REDUCES] == "0"


@pytest.mark.parametrize("mesh", ["batch=8", "batch=4,model=2"])
def test_dataset_input_gives_the_same_run_as_pack(run, mesh):
    packed = run("dtensor", mesh=mesh, dtensor_input="pack")
    from_dataset = run("dtensor", mesh=mesh, dtensor_input="dataset")
    assert from_dataset.details["dtensor_input"] == "dataset"
    np.testing.assert_array_equal(from_dataset.step_losses, packed.step_losses)
    for weight, packed_weight in zip(from_dataset.final_weights, packed.final_weights, strict=True):
        np.testing.assert_array_equal(weight, packed_weight)


@pytest.mark.parametrize("dtensor_input", ["pack", "dataset"])
def test_shuffled_batches_follow_the_shared_epoch_order(run, dtensor_input):
    history = run("dtensor", mesh="batch=8", shuffle=True, dtensor_input=dtensor_input)
    shuffled_reference = run("reference", shuffle=True)
    assert check_parity(history, shuffled_reference, DEFAULT_TOLERANCE).ok
    assert not check_parity(history, run("reference"), DEFAULT_TOLERANCE).ok  # the order matters


def test_deeper_mlp_with_model_axis_matches_the_reference(run):
    """Three hidden layers: column, row, column sharded; the output layer gathers the last one."""
    history = run("dtensor", mesh="batch=4,model=2", hidden=(64, 32, 16))
    parity = check_parity(history, run("reference", hidden=(64, 32, 16)), DEFAULT_TOLERANCE)
    assert parity.ok, parity.reason
    assert history.details["layouts"].startswith("w0[unsharded,model] b0[model] w1[model,unsharded] "
                                                 "b1[unsharded] w2[unsharded,model] b2[model] ")
