"""The DTensor trainer against the reference: parity on every mesh in float32 and float64, a long
tensor-parallel run, the tutorial Adam with a padded last batch, input modes.

Data: the first 237 training and 101 test embedded examples, global batch 64, 2
epochs: 8 steps whose last batch has 45 examples, an odd count, so it goes
through the zero-weight padding on every mesh whose batch axis is larger than 1.
(4 steps an epoch: with 5, the trainer traced one more call shape, ~2 s a run.)
float64 runs take 1 epoch (4 steps, the padded batch included) with hidden widths
64,32 (8 divides 64, the width the model axis shards, so every 8-device mesh runs;
the same layouts and code path, ~100x less compute). Histories are cached per
module, so each configuration trains once.
"""

import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf

from dtensor_vs_mirrored.dtensor_impl import combining
from dtensor_vs_mirrored.dtensor_impl import inputs as dtensor_inputs
from dtensor_vs_mirrored.dtensor_impl import spec as dtensor_spec
from dtensor_vs_mirrored.dtensor_impl import trainer as dtensor_trainer
from dtensor_vs_mirrored.dtensor_impl import variables as dtensor_variables
from dtensor_vs_mirrored.dtensor_impl.mesh import parse_mesh
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.judge.parity import TOLERANCES, check_parity
from dtensor_vs_mirrored.shared.training.registry import fit
from tests.cli import data_slice

pytestmark = pytest.mark.fast  # the release matrix runs these on every TensorFlow release

TRAIN_EXAMPLES, TEST_EXAMPLES = 237, 101
BASE = Config(epochs=2, batch_size=64, quiet=True)
STEPS = 2 * 4  # 3 batches of 64 and one of 45 per epoch
# float32 with the tutorial's widths: data parallel, and with a model axis (float64 below runs every mesh).
# batch=8: in float64 below, every step and all the state; in float32 sharded, tests/test_sharding.py.
FLOAT32_RUNS = [pytest.param("batch=8", "adam", marks=pytest.mark.extended)] + [  # model axis: float64 below
    pytest.param("batch=2,model=4", optimizer, marks=pytest.mark.extended) for optimizer in ("adam", "sgd")
]
# Every mesh of 8 devices whose model axis divides the sharded width 64, and the smaller batch meshes: Adam on
# each, SGD on one without and one with a model axis (its update has no state to shard).
# (batch=1 and batch=2 on 1 and 2 devices: the sweep's configurations at 2 devices, tests/test_verdicts.py.)
FLOAT64_MESHES = ["batch=8", "batch=4,model=2", "batch=2,model=4", "batch=1,model=8"]
FLOAT64_RUNS = [(mesh, "adam") for mesh in FLOAT64_MESHES] + [("batch=2,model=4", "sgd")]
SMALL_HIDDEN = (64, 32)
FLOAT32 = TOLERANCES["float32"]
# float64 noise measured on these meshes: relative loss differences <= 3e-15 (docs/parity.md).
# Asserting 1e-12 shows it stays far below the float64 tolerance, not just within it.
FLOAT64_NOISE_BOUND = 1e-12
PADDED_MESH = "batch=1,model=8"  # 700 does not divide by 8: padded to 704 with zero units
FLOAT32_RUNS += [(PADDED_MESH, "adam")]


def lacks_float64_collectives(mesh: str, shard_weights: bool = False) -> bool:
    """2.12's and 2.13's DTensor collectives have no float64 on some meshes."""
    needed = dtensor_spec.float64_collectives_since(parse_mesh(mesh, 8), shard_weights)
    return dtensor_spec.tensorflow_release() < needed


def skip_without_float64_collectives(mesh: str) -> None:
    """Skip where this release lacks them (the test below shows they really fail and that the
    trainer refuses them first)."""
    if lacks_float64_collectives(mesh):
        needed = dtensor_spec.float64_collectives_since(parse_mesh(mesh, 8))
        pytest.skip(
            f"float64 on {mesh} needs TensorFlow {needed[0]}.{needed[1]}: this release's DTensor "
            "collectives have none (docs/releases.md)"
        )


@pytest.fixture(scope="module")
def small(embedded):
    return data_slice(embedded, TRAIN_EXAMPLES, TEST_EXAMPLES)


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
                histories[trainer, config] = fit("reference", config, small, devices[:1])
            else:
                mesh_devices = devices[: parse_mesh(config.mesh, len(devices)).device_count]
                histories[trainer, config] = fit("dtensor", config, small, mesh_devices)
        return histories[trainer, config]

    return run


@pytest.mark.parametrize("mesh, optimizer", FLOAT32_RUNS)
def test_matches_the_reference_step_by_step(run, mesh, optimizer):
    history = run("dtensor", mesh=mesh, optimizer=optimizer)
    expected = run("reference", optimizer=optimizer)
    parity = check_parity(history, expected)
    assert parity.ok, parity.reason
    assert len(history.step_losses) == STEPS and parity.steps == STEPS
    assert parity.max_abs_loss_diff <= FLOAT32["loss"].atol
    assert parity.max_abs_grad_diff <= FLOAT32["gradient"].atol
    assert parity.max_abs_weight_diff <= FLOAT32["loss"].atol  # 8 steps: well inside the weights' 1e-3
    for record, expected_record in zip(history.epochs, expected.epochs, strict=True):
        assert abs(record.train_loss - expected_record.train_loss) <= FLOAT32["loss"].atol
        assert abs(record.test_loss - expected_record.test_loss) <= FLOAT32["loss"].atol
        assert abs(record.test_accuracy - expected_record.test_accuracy) <= 1 / TEST_EXAMPLES


@pytest.mark.parametrize("mesh, optimizer", FLOAT64_RUNS)
def test_float64_matches_the_reference_in_every_step_and_all_its_state(run, mesh, optimizer):
    skip_without_float64_collectives(mesh)
    float64 = dict(optimizer=optimizer, dtype="float64", hidden=SMALL_HIDDEN, epochs=1)
    history = run("dtensor", mesh=mesh, **float64)
    parity = check_parity(history, run("reference", **float64))
    assert parity.ok, parity.reason
    assert parity.dtype == "float64" and parity.steps == STEPS // 2
    assert parity.state_judged and len(history.step_state_checksums) == STEPS // 2 + 1  # each step's start, the end
    assert len(history.state_names) == (18 if optimizer == "adam" else 6)  # 6 weights and biases, their m and v
    assert all(weight.dtype == np.float64 for weight in history.final_weights)
    assert parity.max_rel_loss_diff <= FLOAT64_NOISE_BOUND


def test_float64_is_refused_exactly_where_this_releases_dtensor_collectives_reject_it(run, monkeypatch):
    """On 2.12 and 2.13 (the release matrix runs this): each mesh the trainer refuses in float64 really
    fails in DTensor without the check, with DTensor's own error naming the collective."""
    float64 = dict(dtype="float64", hidden=SMALL_HIDDEN, epochs=1)
    cases = [(mesh, False) for mesh in FLOAT64_MESHES] + [("batch=8", True), ("batch=4,model=2", True)]
    refused = [(mesh, sharded) for mesh, sharded in cases if lacks_float64_collectives(mesh, sharded)]
    if not refused:
        pytest.skip(f"TensorFlow {tf.__version__}: DTensor's collectives have float64 on every mesh")
    for mesh, sharded in refused:
        with pytest.raises(UsageError, match=f"--dtype float64 on DTensor mesh {mesh} needs TensorFlow 2.1[34]"):
            run("dtensor", mesh=mesh, shard_weights=sharded, **float64)
    monkeypatch.setattr(dtensor_spec, "check_float64_collectives", lambda dtype, spec, shard_weights=False: None)
    for mesh, sharded in refused:
        with pytest.raises(Exception, match=r"tf\.DTensorAll(Reduce|Gather)' op operand #0 must be"):
            run("dtensor", mesh=mesh, shard_weights=sharded, **float64)


@pytest.mark.extended  # float64 on every mesh: above, in fewer steps
def test_a_long_tensor_parallel_run_matches_in_float64_on_every_step(devices, embedded):
    """104 steps on batch=2,model=4 (208 examples in batches of 16, 8 epochs): in float32 this is where
    compounded noise can leave the tolerance; float64 stays within it on every step, with no window."""
    skip_without_float64_collectives("batch=2,model=4")
    data = dataclasses.replace(
        embedded,
        x_train=embedded.x_train[:208],
        y_train=embedded.y_train[:208],
        x_test=embedded.x_test[:16],
        y_test=embedded.y_test[:16],
    )
    config = Config(epochs=8, batch_size=16, hidden=SMALL_HIDDEN, dtype="float64", quiet=True)
    expected = fit("reference", config, data, devices[:1])
    history = fit("dtensor", config.replace(mesh="batch=2,model=4"), data, devices)
    parity = check_parity(history, expected)
    assert parity.ok, parity.reason
    assert parity.steps == 104 and parity.state_judged
    assert parity.max_rel_loss_diff <= FLOAT64_NOISE_BOUND


def test_history_record_describes_the_run(run):
    history = run("dtensor", mesh="batch=4,model=2")
    assert history.trainer == "dtensor"
    assert history.placement == "mesh batch=4,model=2 over 8 x CPU"
    assert history.details["mesh"] == "batch=4,model=2"
    assert history.details["dtensor_input"] == "pack"
    assert history.details["layouts"] == (
        "layers/0/w[unsharded,model] layers/0/b[model] layers/1/w[model,unsharded] "
        "layers/1/b[unsharded] layers/2/w[unsharded,unsharded] "
        "layers/2/b[unsharded]"
    )
    shapes = [(784, 700), (700,), (700, 500), (500,), (500, 10), (10,)]
    assert [w.shape for w in history.final_weights] == shapes
    assert [g.shape for g in history.first_step_gradients] == shapes
    assert all(isinstance(w, np.ndarray) and w.dtype == np.float32 for w in history.final_weights)
    assert [record.epoch for record in history.epochs] == [1, 2]
    assert history.trace_seconds > 0
    assert history.epochs[-1].train_loss < history.epochs[0].train_loss
    # Epoch 2 groups its batches as epoch 1 does (the first alone, the other 2 full ones, the padded one),
    # so nothing traces in it: grouped from its first batch on, it traced a new call shape inside the measured epoch.
    # The short last batch (45 examples) is padded to the full 64, so it runs in the full batches' one trace.
    assert history.epochs[0].traces == 1 and history.epochs[1].traces == 0
    assert history.details["steps_per_call"] == str(dtensor_trainer.STEPS_PER_CALL)  # the MLP's step is small
    # Fewer full batches than a group of 4 go one a call: the bytes are counted in a call that ran.
    if dtensor_spec.tensorflow_release() < (2, 13):  # DTensor names the functions it lowers to otherwise there
        assert history.traffic is None and "functions that DTensor lowered" in history.traffic_missing
    else:
        assert history.traffic is not None, history.traffic_missing
    # Each of the 8 devices: half the first two layers (784x350, 350 and 350x500), all of the rest.
    per_device = 4 * (784 * 350 + 350 + 350 * 500 + 500 + 500 * 10 + 10)
    assert [(m.device, m.weight_bytes, m.optimizer_bytes) for m in history.memory_per_device] == [
        (f"CPU:{i}", per_device, 2 * per_device + 8) for i in range(8)
    ]


def test_padded_model_hands_out_the_unpadded_one(run):
    history = run("dtensor", mesh=PADDED_MESH)
    assert history.details["padding"] == "hidden1 700 -> 704"
    assert "[unsharded,model]" in history.details["layouts"]
    shapes = [(784, 700), (700,), (700, 500), (500,), (500, 10), (10,)]
    assert [w.shape for w in history.final_weights] == shapes
    assert [g.shape for g in history.first_step_gradients] == shapes
    per_device = 4 * (784 * 88 + 88 + 88 * 500 + 500 + 500 * 10 + 10)  # 704 / 8 = 88 units, 4 of them padding
    assert {m.weight_bytes for m in history.memory_per_device} == {per_device}


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_padded_units_stay_exactly_zero(devices, small, optimizer):
    """Zero in, zero bias, zero out: ReLU gives 0 with gradient 0, so no update ever moves them."""
    from dtensor_vs_mirrored.dtensor_impl.mesh import create_mesh
    from dtensor_vs_mirrored.shared.model.mlp import mlp

    spec, definition = parse_mesh(PADDED_MESH, 8), mlp((60, 32))
    mesh = create_mesh(spec, devices)
    values = definition.pad(definition.initial_values(22), definition.split_sizes(spec.model))
    model = dtensor_variables.build_model(definition, values, mesh)
    optimizer_state = dtensor_variables.build_optimizer(BASE.replace(optimizer=optimizer, hidden=(60, 32)), model, mesh)
    batches = [
        dtensor_inputs.pack_batch(small.x_train[i : i + 64], small.y_train[i : i + 64], mesh) for i in range(0, 256, 64)
    ]
    dtensor_trainer.train_steps(model, optimizer_state, batches)
    w0, b0, w1 = (dtensor_variables.to_numpy(v) for v in model.weights[:3])
    assert w0.shape == (784, 64) and np.abs(w0[:, :60]).max() > 0
    assert not w0[:, 60:].any() and not b0[60:].any() and not w1[60:, :].any()
    if optimizer == "adam":
        for slot in (optimizer_state.m[0], optimizer_state.v[0]):
            assert dtensor_variables.to_numpy(slot).any() and not dtensor_variables.to_numpy(slot)[:, 60:].any()


@pytest.mark.parametrize("mesh", ["batch=2,model=2"])  # with a model axis (data parallel: tests/test_verdicts.py)
def test_tutorial_adam_matches_with_a_short_last_batch_padded_to_the_full_shape(run, mesh):
    """The tutorial's Python-float step count advances once per trace of the update. The short last batch (45
    examples) is padded to the full 64, so DTensor traces its step once, as the reference does, and the frozen
    count is the same in both: the run matches (padded to 48 only, it traced again with the count advanced, and
    the parity check failed the run). (Its stale slot reads need DTensor's all-reduce combining, which this trainer
    turns off on CPU: tests/test_compare.py.)"""
    history = run("dtensor", mesh=mesh, adam="tutorial")
    parity = check_parity(history, run("reference", adam="tutorial"))
    assert parity.ok, parity.reason
    assert [record.traces for record in history.epochs] == [1, 0]
    assert parity.max_abs_loss_diff <= FLOAT32["loss"].atol


def test_a_model_with_batch_statistics_keeps_its_short_last_batch_as_it_is(devices, embedded):
    """Its definition does not say its examples are independent (examples/batch_norm_mlp.py normalises over the
    batch), so the last batch of 40 goes over batch=8 as it is, in a step traced for its shape, and the run matches
    the reference: padded to the full 64, 24 zero rows would have entered its batch statistics."""
    config = Config(model="examples/batch_norm_mlp.py:batch_norm_mlp", epochs=1, batch_size=64, quiet=True)
    data = data_slice(embedded, 232, 64)  # 3 batches of 64 and one of 40
    history = fit("dtensor", config.replace(mesh="batch=8"), data, devices)
    parity = check_parity(history, fit("reference", config, data, devices[:1]))
    assert parity.ok, parity.reason
    assert history.epochs[0].traces == 2 and parity.steps == 4


def test_all_reduce_combining_is_off_on_cpu(run):
    run("dtensor", mesh="batch=2")
    assert os.environ[combining.VARIABLE] == "0"
    assert dtensor_trainer.steps_per_call("CPU") == dtensor_trainer.STEPS_PER_CALL
    # A step of more graph than UNROLL_MAX_OPERATIONS (the ViT's: 2,199) is not unrolled: tracing costs more.
    assert dtensor_trainer.steps_per_call("CPU", dtensor_trainer.UNROLL_MAX_OPERATIONS + 1) == 1


def test_a_trainer_process_combines_the_all_reduces_of_a_model_of_many_variables(monkeypatch):
    from dtensor_vs_mirrored.shared.run.sequence import describe_processes, process_environment

    monkeypatch.setenv(combining.VARIABLE, "0")  # as `settle` leaves it, here or in a process that started this one
    monkeypatch.setenv(combining.SETTLED, "0")
    many = Config(model="gpt", data="embedded")  # 38 trainable variables
    assert combining.environment(many) == {combining.VARIABLE: "1"}
    assert combining.environment(Config()) == {}  # the MLP's 6: off, 4 steps a call
    assert combining.environment(many.replace(adam="tutorial")) == {}  # it reads its slots after assigning them
    assert combining.environment(many.replace(device_type="GPU")) == {}  # TensorFlow's default: on
    # dtensor and mirrored still share one process, with the variable set, and the reference's runs share it.
    assert process_environment("mirrored", many) == process_environment("dtensor", many)
    assert process_environment("reference", many) == process_environment("dtensor", many)
    assert process_environment("mirrored", many)[combining.VARIABLE] == "1"
    assert (
        "reference, dtensor and mirrored in a trainer process (DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION=1"
        " TF_NUM_INTRAOP_THREADS=1)" in describe_processes(many)
    )
    # A run without DTensor names only what its own trainers ask for.
    assert "(TF_NUM_INTRAOP_THREADS=1)" in describe_processes(many.replace(trainers=("reference", "mirrored")))
    monkeypatch.delenv(combining.SETTLED)  # the same "0", yours, set before the run: inherited, never overridden
    assert combining.environment(many) == {}


def test_with_the_combining_on_a_step_a_call_matches_the_reference_in_float64():
    """An MLP of 9 layers (18 variables) in its trainer process: the combining on, one step a call, every step exact
    (6 steps: were it to unroll, a call of 4 would read stale weights)."""
    from dtensor_vs_mirrored.shared.api import check_model

    options = dict(hidden=(16,) * 8, train_examples=192, test_examples=32, batch_size=32, epochs=1, dtype="float64")
    result = check_model("mlp", meshes=("batch=2",), trainers=("dtensor",), devices=2, **options)
    assert result.ok and set(result.verdicts) == {"dtensor batch=2"}, result.summary()
    details = result.run.results["dtensor batch=2"].history.details
    assert details["all_reduce_combining"] == "on" and details["steps_per_call"] == "1"
    parity = result.parity["dtensor batch=2"]
    assert parity.state_judged and parity.steps == 6 and parity.max_abs_loss_diff <= 1e-12


# DTensor started by someone else's op before the trainer runs, the variable unset.
STARTED_BEFORE = """
import json
import os
from dtensor_vs_mirrored.shared.devices import configure_devices
devices = configure_devices(8, "CPU")
import tensorflow as tf
from tensorflow.experimental import dtensor
mesh = dtensor.create_mesh([("batch", 8)], devices=devices)
dtensor.call_with_layout(tf.zeros, dtensor.Layout.replicated(mesh, 1), shape=(2,))  # DTensor starts here
from dtensor_vs_mirrored.dtensor_impl import combining, trainer
from dtensor_vs_mirrored.shared.training import reference
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.training.data import load_data
from dtensor_vs_mirrored.shared.training.registry import fit
data = load_data("embedded", 512, 64)
config = Config(epochs=1, quiet=True)
expected = fit("reference", config, data, devices[:1]).step_losses
losses = fit("dtensor", config, data, devices).step_losses
print(json.dumps({"steps_per_call": trainer.steps_per_call("CPU"), "variable": os.environ.get(combining.VARIABLE),
                  "max_abs_loss_diff": max(abs(a - b) for a, b in zip(losses, expected))}))
"""


@pytest.mark.extended  # a new process for one start-up order
def test_dtensor_started_before_the_trainer_leaves_the_combining_on_and_the_trainer_one_step_per_call():
    """DTensor reads the combining setting once, when it starts. Started before the trainer could
    turn it off, it stays on, so the trainer must not unroll steps (it trained 0.53 off when it did)."""
    import json
    import subprocess
    import sys

    from tensorflow.dtensor.python import api

    assert hasattr(api, "_dtensor_singleton")  # what combining._dtensor_started reads, on this release
    env = {key: value for key, value in os.environ.items() if key != combining.VARIABLE}
    done = subprocess.run(
        [sys.executable, "-c", STARTED_BEFORE],
        cwd=os.path.dirname(os.path.dirname(__file__)),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["steps_per_call"] == 1 and facts["variable"] is None
    assert facts["max_abs_loss_diff"] <= FLOAT32["loss"].atol, facts


@pytest.mark.parametrize("mesh", ["batch=4,model=2"])  # DTensorDataset with a model axis: the harder case
def test_dataset_input_gives_the_same_run_as_pack(run, mesh):
    packed = run("dtensor", mesh=mesh, dtensor_input="pack")
    from_dataset = run("dtensor", mesh=mesh, dtensor_input="dataset")
    assert from_dataset.details["dtensor_input"] == "dataset"
    np.testing.assert_array_equal(from_dataset.step_losses, packed.step_losses)
    for weight, packed_weight in zip(from_dataset.final_weights, packed.final_weights, strict=True):
        np.testing.assert_array_equal(weight, packed_weight)


@pytest.mark.extended  # the shared epoch order: the reference's and MirroredStrategy's tests; DTensorDataset: above
@pytest.mark.parametrize("dtensor_input", ["dataset"])  # DTensorDataset's own batching; pack: batch order alone
def test_shuffled_batches_follow_the_shared_epoch_order(run, dtensor_input):
    history = run("dtensor", mesh="batch=8", shuffle=True, dtensor_input=dtensor_input)
    shuffled_reference = run("reference", shuffle=True)
    assert check_parity(history, shuffled_reference).ok
    assert not check_parity(history, run("reference")).ok  # the order matters


@pytest.mark.extended  # a model axis with the default hidden sizes: above
def test_deeper_mlp_with_model_axis_matches_the_reference(run):
    """Three hidden layers: column, row, column sharded; the output layer gathers the last one."""
    history = run("dtensor", mesh="batch=4,model=2", hidden=(64, 32, 16))
    parity = check_parity(history, run("reference", hidden=(64, 32, 16)))
    assert parity.ok, parity.reason
    assert history.details["layouts"].startswith(
        "layers/0/w[unsharded,model] layers/0/b[model] "
        "layers/1/w[model,unsharded] layers/1/b[unsharded] "
        "layers/2/w[unsharded,model] layers/2/b[model] "
    )
