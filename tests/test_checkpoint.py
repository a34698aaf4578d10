"""Checkpoints and export: any trainer resumes any other's run, a killed writer leaves the previous
checkpoint, mismatches are one line, and every trainer's SavedModel serves its predictions.

Data: the first 236 training and 100 test embedded examples, global batch 64: 4 steps per
epoch, the last of 44 examples. DTensor (batch=4,model=2 with --shard-weights: every weight
and Adam slot split over both axes) and MirroredStrategy (8 replicas) each train 2 epochs and
checkpoint; every pair then trains the 3rd epoch from the other's checkpoint and is compared
with one uninterrupted 3-epoch reference run.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.judge.parity import TOLERANCES
from dtensor_vs_mirrored.shared.model.mlp import mlp
from dtensor_vs_mirrored.shared.report.progress import Printed
from dtensor_vs_mirrored.shared.training import checkpoint, export
from dtensor_vs_mirrored.shared.training.registry import fit
from tests.cli import data_slice, run_here, unwrapped

TRAIN_EXAMPLES, TEST_EXAMPLES = 236, 100
STEPS_PER_EPOCH = 4  # 3 x 64 + 44 (5 steps traced one more call shape: ~2 s a run)
BASE = Config(epochs=3, batch_size=64, quiet=True)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRITER_MESH = "batch=4,model=2"  # with --shard-weights
# (written by, mesh, resumed by, mesh): the issues' pairs.
PAIRS = [
    ("dtensor", WRITER_MESH, "mirrored", None),
    ("mirrored", None, "dtensor", "batch=4,model=2"),
    ("dtensor", WRITER_MESH, "reference", None),
    ("mirrored", None, "reference", None),
    ("dtensor", WRITER_MESH, "dtensor", "batch=1,model=8"),
]  # sharded into a mesh that pads 700 to 704 and shards on the model axis alone


@pytest.fixture(scope="module")
def small(embedded):
    return data_slice(embedded, TRAIN_EXAMPLES, TEST_EXAMPLES)


def train(trainer, config, data, devices):
    return fit(trainer, config, data, devices[:1] if trainer == "reference" else devices)


@pytest.fixture(scope="module")
def uninterrupted(small, devices):
    return fit("reference", BASE, small, devices[:1])


@pytest.fixture(scope="module")
def written(small, devices, tmp_path_factory):
    """{trainer: (its 2-epoch history, DIR/<trainer> holding epoch-0001 and epoch-0002)}."""
    directory = tmp_path_factory.mktemp("checkpoints")
    config = BASE.replace(epochs=2, checkpoint_dir=str(directory))
    sharded = config.replace(mesh=WRITER_MESH, shard_weights=True)
    return {
        "dtensor": (train("dtensor", sharded, small, devices), directory / "dtensor"),
        "mirrored": (train("mirrored", config, small, devices), directory / "mirrored"),
    }


@pytest.fixture(scope="module")
def resumed(small, devices, written, tmp_path_factory):
    """resumed(writer, resumer, mesh) -> the resumer's history of epoch 3, restored from the writer's epoch 2.

    Each resumed run also exports its model (test_exports_... check those SavedModels)."""
    histories = {}
    export_root = tmp_path_factory.mktemp("exports")

    def resumed(writer, resumer, mesh):
        if (writer, resumer, mesh) not in histories:
            config = BASE.replace(
                restore=str(written[writer][1]),
                mesh=mesh,
                export=str(export_root / f"{writer}-to-{resumer}-{mesh or ''}"),
            )
            histories[writer, resumer, mesh] = train(resumer, config, small, devices)
        return histories[writer, resumer, mesh]

    return resumed


def max_abs_diff(arrays, expected_arrays) -> float:
    return max(
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
        for a, b in zip(arrays, expected_arrays, strict=True)
    )


def test_a_checkpoint_holds_the_writers_final_state(written):
    for _name, (history, directory) in written.items():
        prefix = checkpoint.resolve(str(directory))
        assert prefix == str(directory / "epoch-0002" / "ckpt")  # the newest of epoch-0001, epoch-0002
        progress = checkpoint.read_progress(prefix)
        assert (int(progress["epoch"]), int(progress["batch"]), int(progress["step"])) == (2, 0, 2 * STEPS_PER_EPOCH)
        assert progress["model"] == b"mlp 784-700-500-10" and progress["optimizer"] == b"adam"
        for stored, final in zip(checkpoint.weights_of(prefix, mlp()), history.final_weights, strict=True):
            np.testing.assert_array_equal(stored, final)


@pytest.mark.parametrize("writer, writer_mesh, resumer, mesh", PAIRS)
def test_resumed_run_matches_the_uninterrupted_one(resumed, uninterrupted, writer, writer_mesh, resumer, mesh):
    history = resumed(writer, resumer, mesh)
    assert [record.epoch for record in history.epochs] == [3]
    assert len(history.step_losses) == STEPS_PER_EPOCH
    loss_diff = float(np.max(np.abs(np.array(history.step_losses) - uninterrupted.step_losses[-STEPS_PER_EPOCH:])))
    weight_diff = max_abs_diff(history.final_weights, uninterrupted.final_weights)
    print(
        f"\n{writer} ({writer_mesh or '8 replicas'}) -> {resumer} ({mesh or ''}): "
        f"max |loss diff| {loss_diff:.3g}, max |weight diff| {weight_diff:.3g}"
    )
    assert loss_diff <= TOLERANCES["float32"]["loss"].atol
    assert weight_diff <= TOLERANCES["float32"]["weight"].atol
    assert abs(history.epochs[0].test_loss - uninterrupted.epochs[2].test_loss) <= TOLERANCES["float32"]["loss"].atol


def test_a_padded_mesh_checkpoints_the_unpadded_model_that_others_resume(
    small, devices, uninterrupted, tmp_path_factory
):
    directory = tmp_path_factory.mktemp("padded")
    written_padded = train(
        "dtensor",
        BASE.replace(
            epochs=2, checkpoint_dir=str(directory), mesh="batch=1,model=8", export=str(directory / "exported")
        ),
        small,
        devices,
    )
    # The export holds the unpadded weights and serves the padded mesh's own logits.
    assert float(written_padded.details["export_max_abs_logit_diff"]) <= export.LOGIT_TOLERANCE
    prefix = checkpoint.resolve(str(directory / "dtensor"))
    for stored, final in zip(checkpoint.weights_of(prefix, mlp()), written_padded.final_weights, strict=True):
        np.testing.assert_array_equal(stored, final)  # (784, 700), (700,), (700, 500), ...: no padding
    import tensorflow as tf

    assert tf.train.load_checkpoint(prefix).get_tensor("optimizer/m/0/.ATTRIBUTES/VARIABLE_VALUE").shape == (784, 700)
    history = train("reference", BASE.replace(restore=str(directory / "dtensor")), small, devices)
    assert (
        max_abs_diff(history.step_losses, uninterrupted.step_losses[-STEPS_PER_EPOCH:])
        <= TOLERANCES["float32"]["loss"].atol
    )
    assert max_abs_diff(history.final_weights, uninterrupted.final_weights) <= TOLERANCES["float32"]["weight"].atol


@pytest.fixture(scope="module")
def sgd_checkpoint(small, devices, tmp_path_factory):
    directory = tmp_path_factory.mktemp("sgd")
    fit("reference", BASE.replace(epochs=1, optimizer="sgd", checkpoint_dir=str(directory)), small, devices[:1])
    return directory / "reference" / "epoch-0001"


def test_mismatched_architecture_is_one_line(written, small, devices):
    path = written["dtensor"][1]
    config = BASE.replace(restore=str(path), hidden=(64, 32))
    expected = (
        f"checkpoint {path}/epoch-0002 was written for hidden 700,500 but --hidden 64,32 was given; "
        f"use --hidden 700,500"
    )
    with pytest.raises(UsageError) as raised:
        checkpoint.check_config(config)
    assert str(raised.value) == expected
    with pytest.raises(UsageError, match="^" + expected + "$"):  # the trainers check too, before training
        fit("dtensor", config.replace(mesh="batch=4,model=2"), small, devices)


def test_mismatched_optimizer_is_one_line(written, sgd_checkpoint, small, devices):
    with pytest.raises(UsageError) as raised:
        checkpoint.check_config(BASE.replace(restore=str(sgd_checkpoint)))
    assert str(raised.value) == (
        f"checkpoint {sgd_checkpoint} holds sgd state but --optimizer adam was given (adam vs sgd); use --optimizer sgd"
    )
    adam_checkpoint = written["mirrored"][1] / "epoch-0001"
    with pytest.raises(
        UsageError,
        match=r"^checkpoint .*/mirrored/epoch-0001 holds adam state but --optimizer sgd "
        r"was given \(sgd vs adam\); use --optimizer adam$",
    ):
        fit("mirrored", BASE.replace(restore=str(adam_checkpoint), optimizer="sgd"), small, devices)


def test_a_checkpoint_restores_only_into_its_own_dtype(written, small, devices):
    """float32 state does not restore into a float64 run (it would need a conversion): one line."""
    path = written["dtensor"][1]
    assert checkpoint.read_progress(checkpoint.resolve(str(path)))["dtype"] == b"float32"
    expected = f"checkpoint {path}/epoch-0002 holds float32 state but --dtype float64 was given; use --dtype float32"
    with pytest.raises(UsageError) as raised:
        checkpoint.check_config(BASE.replace(restore=str(path), dtype="float64"))
    assert str(raised.value) == expected


def test_nothing_left_to_train_and_missing_checkpoints_are_one_line(written, tmp_path):
    path = written["dtensor"][1]
    with pytest.raises(
        UsageError,
        match=r"^checkpoint .*/dtensor/epoch-0002 is at epoch 2 and --epochs 2 leaves "
        r"nothing to train \(--epochs is the total\); use --epochs 3 or more$",
    ):
        checkpoint.check_config(BASE.replace(restore=str(path), epochs=2))
    with pytest.raises(
        UsageError,
        match=r"holds checkpoints of dtensor, mirrored; name one, e\.g\. --restore "
        r".*/dtensor$",
    ):
        checkpoint.check_config(BASE.replace(restore=str(path.parent)))
    with pytest.raises(UsageError, match=r"^--restore .*: no checkpoint there; give a DIR/<trainer>"):
        checkpoint.check_config(BASE.replace(restore=str(tmp_path)))


# --- a writer killed mid-write ---------------------------------------------------------------

# Writes epoch-0001, epoch-0002, ... of a 70 MB state (hidden 2048,2048 with Adam slots) with
# every weight set to the epoch number, printing each epoch after it is published.
WRITER = """
import sys
import numpy as np
import tensorflow as tf
from dtensor_vs_mirrored.shared.training.checkpoint import TrainingState
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.model.mlp import mlp
from dtensor_vs_mirrored.shared.model.definition import Model
from dtensor_vs_mirrored.shared.training.optim import make_optimizer
config = Config(hidden=(2048, 2048))
model = Model(mlp(config.hidden), [np.zeros(v.shape, np.float32) for v in mlp(config.hidden).initial_values(0)])
optimizer = make_optimizer(config, model.weights, lambda v: tf.Variable(tf.zeros_like(v)),
                           lambda: tf.Variable(0, dtype=tf.int64))
state = TrainingState("reference", config, model, optimizer, 300)
for epoch in range(1, 100):
    for weight in model.weights:
        weight.assign(tf.fill(weight.shape, float(epoch)))
    state.save(sys.argv[1], epoch)
    print(epoch, flush=True)
"""


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint(tmp_path):
    directory = tmp_path / "killed"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert writer.stdout.readline().strip() == "1", "the writer did not publish epoch-0001"
        partial = directory / ".epoch-0002.partial"
        deadline = time.monotonic() + 60
        while not (partial.exists() and any(partial.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.001)  # kill as soon as TensorFlow has started writing epoch 2's files
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    finally:
        writer.kill()
    assert writer.returncode == -signal.SIGKILL
    assert partial.exists() and not (directory / "epoch-0002").exists(), "the kill did not land mid-write"

    prefix = checkpoint.resolve(str(directory))
    assert prefix == str(directory / "epoch-0001" / "ckpt")
    import tensorflow as tf

    from dtensor_vs_mirrored.shared.model.definition import Model
    from dtensor_vs_mirrored.shared.model.mlp import mlp
    from dtensor_vs_mirrored.shared.training.optim import make_optimizer

    config = Config(hidden=(2048, 2048), epochs=3, restore=str(directory), quiet=True)
    definition = mlp(config.hidden)
    model = Model(definition, [np.zeros(v.shape, np.float32) for v in definition.initial_values(0)])
    optimizer = make_optimizer(
        config,
        model.weights,
        lambda v: tf.Variable(tf.zeros_like(v)),
        lambda: tf.Variable(0, dtype=tf.int64),
    )
    state = checkpoint.TrainingState("reference", config, model, optimizer, 300)
    assert state.restore() == 1
    assert all(np.all(weight.numpy() == 1.0) for weight in model.weights)

    state.save(str(directory), 2)  # the next writer clears the leftover and publishes
    assert not partial.exists() and checkpoint.latest(str(directory)) == str(directory / "epoch-0002")


def test_only_the_newest_checkpoints_are_kept_and_they_honour_the_umask(small, devices, tmp_path):
    config = BASE.replace(epochs=4, checkpoint_dir=str(tmp_path), keep_checkpoints=2, hidden=(16, 8))
    logged = []
    fit("reference", config, small, devices[:1], Printed(logged.append, config.quiet))
    assert logged == []  # --quiet: no line per checkpoint
    directory = tmp_path / "reference"
    assert sorted(os.listdir(directory)) == ["epoch-0003", "epoch-0004"]
    # Without --quiet, one line per checkpoint written, naming what --keep-checkpoints removed.
    said_config = config.replace(quiet=False, checkpoint_dir=str(tmp_path / "said"))
    fit("reference", said_config, small, devices[:1], Printed(logged.append))
    said = tmp_path / "said" / "reference"
    assert [line for line in logged if " checkpoint " in line] == [
        f"reference  checkpoint {said}/epoch-0001",
        f"reference  checkpoint {said}/epoch-0002",
        f"reference  checkpoint {said}/epoch-0003 (removed epoch-0001)",
        f"reference  checkpoint {said}/epoch-0004 (removed epoch-0002)",
    ]
    umask = os.umask(0o022)
    os.umask(umask)
    for path in [directory / "epoch-0004", *(directory / "epoch-0004").iterdir()]:
        expected = (0o777 if path.is_dir() else 0o666) & ~umask
        assert path.stat().st_mode & 0o777 == expected, path
    # 0 keeps every epoch.
    fit("reference", config.replace(keep_checkpoints=0, checkpoint_dir=str(tmp_path / "all")), small, devices[:1])
    assert sorted(os.listdir(tmp_path / "all" / "reference")) == [f"epoch-000{e}" for e in (1, 2, 3, 4)]


# --- SavedModel export -----------------------------------------------------------------------


def export_check(*directories):
    """`python -m dtensor_vs_mirrored.shared.export DIR...` as a user runs it: TF_CPP_MIN_LOG_LEVEL unset."""
    env = dict({k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}, PYTHONPATH=ROOT)
    return subprocess.run(
        [sys.executable, "-m", "dtensor_vs_mirrored.shared.export", *directories],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


EXPORTED = [
    ("dtensor", "reference", None),
    ("mirrored", "dtensor", "batch=4,model=2"),
    ("dtensor", "mirrored", None),
]  # (writer, exporting trainer, its mesh): one per trainer


# extended: each trainer's export is checked against its own logits in test_compare_restores_checkpoints_and_exports
@pytest.mark.extended
def test_exports_serve_the_trainers_predictions_in_a_fresh_process(resumed):
    directories = {}
    for writer, trainer, mesh in EXPORTED:
        details = resumed(writer, trainer, mesh).details
        assert float(details["export_max_abs_logit_diff"]) <= export.LOGIT_TOLERANCE
        directories[trainer] = details["export"]
    # A fresh process: no logical devices configured, no mesh, no strategy; loads, predicts, compares.
    # TensorFlow's own start-up lines are hidden, as compare.py hides them (conftest's TF_CPP_MIN_LOG_LEVEL
    # is a user's choice to see them, so it is not passed on).
    result = export_check(*directories.values())
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    for trainer, directory in directories.items():
        line = next(line for line in lines if line.startswith(directory + ":"))
        print(f"\n{trainer}: {line}")
        assert line.endswith(
            f"against the trainer's own on its probe images, tolerance {export.LOGIT_TOLERANCE:g} (ok)"
        )
    not_an_export = export_check(directories["dtensor"], os.path.dirname(directories["dtensor"]))
    assert not_an_export.returncode == 2 and not_an_export.stdout == ""
    assert not_an_export.stderr.splitlines() == [
        f"python -m dtensor_vs_mirrored.shared.export: error: {os.path.dirname(directories['dtensor'])} is not an "
        f"export of compare.py --export (it has no assets.extra/probe.npz)"
    ]
    missing = export_check(directories["dtensor"] + "-not-there")
    assert missing.returncode == 2 and missing.stderr.splitlines() == [
        f"python -m dtensor_vs_mirrored.shared.export: error: {directories['dtensor']}-not-there: no such directory; "
        f"give one that compare.py --export DIR wrote, DIR/<trainer>"
    ]

    import tensorflow as tf

    serving = tf.saved_model.load(directories["dtensor"]).signatures["serving_default"]
    assert serving.structured_input_signature == ((), {"images": tf.TensorSpec([None, 784], tf.float32, name="images")})
    assert {name: spec.shape.as_list() for name, spec in serving.structured_outputs.items()} == {
        "logits": [None, 10],
        "probabilities": [None, 10],
    }


# --- the command line ------------------------------------------------------------------------


def test_compare_restores_checkpoints_and_exports(written, tmp_path):
    """compare.py resumes DTensor's epoch-2 checkpoint on a 2-device mesh and 2 replicas."""
    result = run_here(
        "--data",
        "embedded",
        "--train-examples",
        str(TRAIN_EXAMPLES),
        "--test-examples",
        str(TEST_EXAMPLES),
        "--batch-size",
        "64",
        "--epochs",
        "3",
        "--devices",
        "2",
        "--trainers",
        "dtensor,mirrored",
        "--restore",
        str(written["dtensor"][1]),
        "--checkpoint-dir",
        str(tmp_path / "checkpoints"),
        "--export",
        str(tmp_path / "exported"),
        "--no-timing",  # timed: tests/test_compare.py
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.rstrip().endswith("PARITY OK")
    for name in ("reference", "dtensor", "mirrored"):
        assert (
            f"{name:<10} restored {written['dtensor'][1]}/epoch-0002: epoch 2, step {2 * STEPS_PER_EPOCH}; "
            "training epochs 3..3" in unwrapped(result.stdout)
        )
        assert f"{name:<10} checkpoint {tmp_path}/checkpoints/{name}/epoch-0003" in unwrapped(result.stdout)
        assert f"{name:<10} epoch 3/3" in result.stdout and f"{name:<10} epoch 2/3" not in result.stdout
        assert os.listdir(tmp_path / "checkpoints" / name) == ["epoch-0003"]
        assert os.path.exists(tmp_path / "exported" / name / "saved_model.pb")

    mismatch = run_here(
        "--data", "embedded", "--epochs", "3", "--hidden", "64,32", "--restore", str(written["dtensor"][1])
    )
    assert mismatch.returncode == 2
    assert mismatch.stderr.strip().splitlines()[-1] == (
        f"compare.py: error: checkpoint {written['dtensor'][1]}/epoch-0002 was written for hidden 700,500 "
        f"but --hidden 64,32 was given; use --hidden 700,500"
    )


@pytest.mark.extended  # compare.py --restore: the test above
def test_a_resumed_run_is_judged_against_an_uninterrupted_reference(written, uninterrupted, tmp_path):
    """--reference-from-scratch: DTensor and MirroredStrategy resume DTensor's epoch-1 checkpoint, the
    reference trains epochs 1 and 2 from the initial values, and parity is judged on epoch 2's 4 steps.
    The same checkpoint against a reference from another seed is a MISMATCH at the restore point: the
    check compares the resumed state with the uninterrupted one, not with itself."""

    def resume(*args):
        report_path = tmp_path / f"report{len(args)}.json"
        result = run_here(
            "--data",
            "embedded",
            "--train-examples",
            str(TRAIN_EXAMPLES),
            "--test-examples",
            str(TEST_EXAMPLES),
            "--batch-size",
            "64",
            "--epochs",
            "2",
            "--devices",
            "2",
            "--trainers",
            "dtensor,mirrored",
            "--restore",
            str(written["dtensor"][1] / "epoch-0001"),
            "--reference-from-scratch",
            "--json",
            str(report_path),
            *args,
        )
        return result, json.loads(report_path.read_text())

    result, report = resume()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "reference  epoch 1/2" in result.stdout and "reference  restored" not in result.stdout
    for name in ("dtensor", "mirrored"):
        assert (
            f"{name:<10} restored {written['dtensor'][1]}/epoch-0001: epoch 1, step {STEPS_PER_EPOCH}; "
            "training epochs 2..2" in unwrapped(result.stdout)
        )
        parity = report["parity"][name]
        assert parity["verdict"] == "ok" and parity["steps"] == STEPS_PER_EPOCH
        assert parity["gradients_judged"] is False and parity["max_abs_grad_diff"] is None
        assert parity["max_abs_loss_diff"] <= TOLERANCES["float32"]["loss"].atol
    assert (
        f"Parity against the single-device reference trained from scratch, on the {STEPS_PER_EPOCH} steps after the "
        "restore point"
    ) in result.stdout
    # What is compared is the uninterrupted reference's epoch 2: the 3-epoch run's steps 4-7, its epoch 2.
    compared = report["trainers"]["reference"]
    np.testing.assert_allclose(
        compared["step_losses"], uninterrupted.step_losses[STEPS_PER_EPOCH : 2 * STEPS_PER_EPOCH], rtol=1e-6, atol=1e-6
    )
    assert [epoch["epoch"] for epoch in compared["epochs"]] == [2]

    other_seed, report = resume("--seed", "5", "--quiet")
    assert other_seed.returncode == 1 and other_seed.stdout.rstrip().endswith("PARITY FAILED")
    assert {report["parity"][name]["verdict"] for name in ("dtensor", "mirrored")} == {"MISMATCH"}
    assert report["parity"]["dtensor"]["first_disagreeing_step"] == 0
