"""The reference trainer learns, and its history record is complete and consistent."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.devices import configure_devices
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.training.registry import fit
from tests.cli import ROOT

# Measured: 3 epochs of Adam on the 4,000 embedded training images give test accuracy
# 0.927 (train loss 0.700 -> 0.256 -> 0.150); 0.90 leaves room for other CPUs' rounding.
MIN_TEST_ACCURACY_AFTER_3_EPOCHS = 0.90


@pytest.fixture(scope="module")
def history(devices, embedded):
    return fit("reference", Config(epochs=3, quiet=True), embedded, devices)


def test_reference_learns_on_embedded_data(history):
    losses = [record.train_loss for record in history.epochs]
    assert losses[0] > losses[1] > losses[2]
    assert history.epochs[-1].test_accuracy >= MIN_TEST_ACCURACY_AFTER_3_EPOCHS
    assert history.step_losses[0] == pytest.approx(np.log(10), abs=0.1)  # untrained: ~uniform


def test_history_record_is_complete(history):
    steps_per_epoch = -(-4000 // 128)  # 31 full batches and one of 32
    assert len(history.step_losses) == 3 * steps_per_epoch
    assert [r.epoch for r in history.epochs] == [1, 2, 3]
    # The epoch's train loss is the example-weighted mean of its step losses.
    first_epoch = np.array(history.step_losses[:steps_per_epoch])
    counts = np.array([128] * 31 + [32])
    assert history.epochs[0].train_loss == pytest.approx((first_epoch * counts).sum() / 4000, rel=1e-9)
    assert [g.shape for g in history.first_step_gradients] == [w.shape for w in history.final_weights]
    assert history.trace_seconds > 0 and all(r.train_seconds > 0 for r in history.epochs)
    assert [r.traces > 0 for r in history.epochs] == [True, False, False]  # only the first epoch traces
    assert [(m.device, m.weight_bytes, m.optimizer_bytes) for m in history.memory_per_device] == [
        ("CPU:0", 4 * 905_010, 8 * 905_010 + 8)
    ]  # weights; Adam's m, v and step


def test_achieved_gflops_are_examples_per_second_times_flops_from_whole_measured_epochs(history, embedded, devices):
    """The arithmetic on set seconds (the timings themselves are the benchmark's, not a test's): a figure once
    came from one short epoch less its trace time and printed 1497% of the peak. Figures come from whole
    epochs after the first, each at least the floor; below it there is no figure and no peak is measured."""
    from dtensor_vs_mirrored.shared.measure.history import MIN_MEASURED_SECONDS
    from dtensor_vs_mirrored.shared.report.document import compute_facts
    from dtensor_vs_mirrored.shared.run.comparison import matmul_peak_for
    from dtensor_vs_mirrored.shared.run.sequence import RunResult, TrainerResult

    def run_of(seconds):
        timed = dataclasses.replace(
            history, epochs=[dataclasses.replace(record, train_seconds=seconds) for record in history.epochs]
        )
        results = {"reference": TrainerResult("reference", timed)}
        return RunResult(
            config=Config(epochs=3, quiet=True), devices=devices[:1], data=embedded, results=results, parity={}
        )

    run = run_of(2.0)  # every epoch 2 s: len(y_train) / 2 examples a second
    run.matmul_peak_gflops = 100.0
    facts = compute_facts(run)
    examples_per_s = len(embedded.y_train) / 2.0
    assert facts["achieved_gflops"]["reference"] == pytest.approx(examples_per_s * facts["flops_per_example"] / 1e9)
    slow_first = run_of(2.0)
    slow_first.results["reference"].history.epochs[0].train_seconds = 9.0  # the first traces: never counted
    assert compute_facts(slow_first)["achieved_gflops"]["reference"] == facts["achieved_gflops"]["reference"]
    short = run_of(MIN_MEASURED_SECONDS / 2)
    assert matmul_peak_for(short) is None and compute_facts(short)["achieved_gflops"]["reference"] is None


def test_reference_is_deterministic(devices, embedded):
    config = Config(epochs=1, quiet=True, train_examples=300)
    small = embedded.__class__(
        embedded.x_train[:300],
        embedded.y_train[:300],
        embedded.x_test[:100],
        embedded.y_test[:100],
        "embedded",
        "test slice",
    )
    first, second = fit("reference", config, small, devices), fit("reference", config, small, devices[1:])
    assert first.step_losses == second.step_losses
    for a, b in zip(first.final_weights, second.final_weights):
        np.testing.assert_array_equal(a, b)


def test_device_requests_after_initialisation(devices):
    tf.zeros(1)  # an op has run, as in any test before it: TensorFlow's runtime started and fixed the 8
    assert configure_devices(4) == ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]
    with pytest.raises(UsageError, match=r"--devices 9: TensorFlow is already initialised with 8 logical CPUs"):
        configure_devices(9)
    with pytest.raises(UsageError, match=r"--devices 0 is not possible"):
        configure_devices(0)
    from dtensor_vs_mirrored.shared.api import check_model

    with pytest.raises(UsageError, match=r"^devices=9: TensorFlow is already initialised with 8 logical CPUs"):
        check_model(devices=9)  # the Python API's argument, not compare.py's flag
    if not tf.config.list_physical_devices("GPU"):
        with pytest.raises(UsageError, match=r"^device_type=GPU: no GPU is visible to TensorFlow; use device_type=CPU"):
            check_model(devices=1, device_type="GPU")


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            dict(train_examples=5000),
            "train_examples=5000 is more than the 4000 train examples in the embedded set; use",
        ),
        (dict(train_examples=0), "argument train_examples: 0 is not a positive integer"),  # UsageError's field
        (dict(hidden=(64,), model="vit"), "hidden sets the MLP's layers; drop it, or use model=mlp (not vit)"),
        (dict(meshes=("batch=3",)), "meshes entry batch=3 covers 3 devices"),
        (dict(data="/no/such/dir"), "data=/no/such/dir: no such directory; give a directory with the MNIST IDX files"),
        (dict(foo=1), "foo=1: check_model has no such option; use a field of dtensor_vs_mirrored.shared.config.Config"),
        (dict(epochs="2"), "epochs='2': epochs takes an int"),
        (dict(clip_global_norm="1"), "clip_global_norm='1': clip_global_norm takes a float or None"),
        (dict(mesh="batch=4"), "mesh='batch=4': give the meshes as check_model's own argument, meshes=('batch=4',)"),
        (dict(quiet=False), "quiet: check_model always runs quietly; drop it"),
    ],
)
def test_check_model_names_its_own_arguments_in_its_one_line(arguments, message):
    """A bad argument to check_model is a UsageError naming the argument as check_model takes it, not compare.py's
    flag (`--train-examples 5000`) nor a TypeError."""
    from dtensor_vs_mirrored.shared.api import check_model

    with pytest.raises(UsageError) as raised:
        check_model(**arguments)
    assert str(raised.value).startswith(message), str(raised.value)


def test_check_models_terms_leave_paths_and_words_alone_and_numpy_numbers_pass():
    from dtensor_vs_mirrored.shared.api import _named_in_api, check_options

    assert _named_in_api("checkpoint /tmp/x--seed/ckpt is at epoch 3 and --epochs 3 leaves nothing") == (
        "checkpoint /tmp/x--seed/ckpt is at epoch 3 and epochs=3 leaves nothing"
    )
    assert _named_in_api("--clip-global-norm clips; --restore's file; --hidden 64,32; --no-timing") == (
        "clip_global_norm clips; --restore's file; hidden=64,32; timing=False"
    )
    checked = check_options({"epochs": np.int64(2), "learning_rate": np.float32(0.5), "hidden": (16,)})
    assert checked == {"epochs": 2, "learning_rate": 0.5, "hidden": (16,)}
    assert type(checked["epochs"]) is int and type(checked["learning_rate"]) is float


def test_a_logical_device_setup_made_before_any_op_is_kept_where_it_has_enough():
    """Yours, made before anything ran (a test's conftest, a script): 4 logical CPUs serve a request for 2 and stay 4;
    a request for 8 replaces them, as nothing has run yet."""
    lines, stderr = in_a_new_process(
        "cpu = tf.config.list_physical_devices('CPU')[0]",
        "tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)",
        "from dtensor_vs_mirrored.shared.devices import configure_devices",
        "print(configure_devices(2), len(tf.config.get_logical_device_configuration(cpu)))",
        "print(len(configure_devices(8)), len(tf.config.list_logical_devices('CPU')))",
    )
    assert lines[:2] == ["['CPU:0', 'CPU:1'] 4", "8 8"], stderr[-2000:]


@pytest.mark.extended  # two checks in a new process: the device set-up's rule is the test above's
def test_checks_in_a_new_process_ask_for_more_devices_after_fewer():
    """A user's tests call check_model in any order: the first, setting the devices up, makes 8 logical CPUs, so a
    check on 4 devices after one on 2 runs (before, it was `devices=4: TensorFlow is already initialised with 2
    logical CPUs`, and examples/test_keras_cnn.py failed so when run as its docstring says)."""
    lines, stderr = in_a_new_process(
        "from dtensor_vs_mirrored.shared.api import check_model",
        "small = dict(epochs=1, train_examples=64, test_examples=32, batch_size=32, hidden=(16,), "
        "trainer_process='shared')",
        "first = check_model(meshes=('batch=2',), devices=2, **small)",
        "second = check_model(meshes=('batch=4',), devices=4, **small)",
        "print(first.ok, second.ok, sorted(second.verdicts), len(tf.config.list_logical_devices('CPU')))",
    )
    assert lines[-1:] == ["True True ['dtensor batch=4', 'mirrored'] 8"], stderr[-2000:]


@pytest.mark.extended  # a third new process, for the dataset input's devices
def test_a_dtensor_dataset_check_in_a_new_process_makes_only_its_devices():
    """DTensorDataset needs a mesh over every logical device of the process: there the first check makes only the
    devices it asks for, not 8 (it then failed: `--dtensor-input dataset needs a mesh over all 8 logical CPUs`)."""
    lines, stderr = in_a_new_process(
        "from dtensor_vs_mirrored.shared.api import check_model",
        "small = dict(epochs=1, train_examples=64, test_examples=32, batch_size=32, hidden=(16,), "
        "trainer_process='shared', dtensor_input='dataset')",
        "found = check_model(meshes=('batch=2',), devices=2, trainers=('dtensor',), **small)",
        "print(found.ok, sorted(found.verdicts), len(tf.config.list_logical_devices('CPU')))",
    )
    assert lines[-1:] == ["True ['dtensor batch=2'] 2"], stderr[-2000:]


def in_a_new_process(*lines: str):
    """(the lines printed, stderr) of a Python process that runs `lines` after importing TensorFlow as tf, from the
    repository's root: logical devices not yet configured, as in a user's own test process."""
    import subprocess
    import sys

    script = "\n".join(["import tensorflow as tf", *lines])
    found = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return found.stdout.strip().splitlines(), found.stderr


def test_several_steps_per_call_equal_one_step_per_call(embedded):
    """train_steps' loop in the graph gives bit-identical losses and weights to train_step called per batch."""
    from dtensor_vs_mirrored.shared.model.definition import Model
    from dtensor_vs_mirrored.shared.model.mlp import mlp
    from dtensor_vs_mirrored.shared.training.batches import epoch_batches, step_chunks
    from dtensor_vs_mirrored.shared.training.optim import make_optimizer
    from dtensor_vs_mirrored.shared.training.reference import train_step, train_steps

    def model_and_optimizer():
        model = Model(mlp(), mlp().initial_values(22))
        return model, make_optimizer(
            Config(optimizer="adam", adam="fixed", learning_rate=1e-3),
            model.weights,
            lambda v: tf.Variable(tf.zeros_like(v)),
            lambda: tf.Variable(0, dtype=tf.int64),
        )

    batches = list(epoch_batches(embedded.x_train[:300], embedded.y_train[:300], 64))  # 4 x 64 and 44
    per_call_model, per_call_optimizer = model_and_optimizer()
    per_call = [float(train_step(per_call_model, per_call_optimizer, x, y)[0]) for x, y in batches]
    looped_model, looped_optimizer = model_and_optimizer()
    chunks = list(step_chunks(batches, first_alone=True))
    assert [len(y) for _, y in chunks] == [1, 3, 1]  # the first alone, the other full ones, the partial one
    looped = [float(loss) for x, y in chunks for loss in train_steps(looped_model, looped_optimizer, x, y)[0]]
    assert looped == per_call
    for a, b in zip(looped_model.weights, per_call_model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
