"""A compiled Keras model trains its own objective on every trainer (shared/model/keras_objective.py): its compiled
loss per example on the targets it takes (float values, 0/1 labels, class ids), its own losses (regularizers, added
once per global step on any replica count), each checked in the data before anything trains; a regression's results
carry no accuracy. Float64, parity within 1e-7 as everywhere."""

import json

import numpy as np
import pytest
import tensorflow as tf

pytest.importorskip("keras", minversion="3", reason="Keras models need Keras 3 (TensorFlow 2.16 or later)")

from dtensor_vs_mirrored.shared.api import check_model
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.model.registry import load
from dtensor_vs_mirrored.shared.training import npz
from dtensor_vs_mirrored.shared.training.losses import label_count, loss_sum
from tests.cli import check_report, run_here
from tests.models.keras_objectives import write_data

MODELS = "tests/models/keras_objectives.py"
# 198 examples in batches of 48: the last batch of 6 is 2, 2, 1, 1 on 4 replicas, 3, 3 on 2, and DTensor pads it to 8
UNEVEN = dict(dtype="float64", epochs=1, batch_size=48, train_examples=198, test_examples=64)
UNEVEN["trainer_process"] = "shared"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("objective")
    return {kind: write_data(str(folder / f"{kind}.npz"), kind) for kind in ("values", "binary", "classes")}


def test_float_targets_sum_one_loss_an_example_and_padding_examples_count_nothing():
    outputs = tf.constant([[1.0], [2.0], [5.0], [0.0]], tf.float64)
    targets = tf.constant([[0.0], [4.0], [5.0], [9.0]], tf.float32)
    weights = tf.constant([1.0, 1.0, 1.0, 0.0])  # the last: a padding example
    assert float(loss_sum(outputs, targets, weights)) == 1.0 + 4.0 + 0.0
    assert float(label_count(targets, weights)) == 3.0


def test_a_compiled_regression_takes_float_targets_of_its_output_with_its_own_loss():
    definition = load(f"{MODELS}:regression")
    assert (definition.targets, definition.label_shape, definition.loss_name) == ("values", (1,), "mse")
    assert not definition.has_accuracy
    assert definition.objective.startswith("the compiled loss mse on float targets, per example, averaged over")
    assert definition.objective.endswith(
        "the compiled optimizer Adam(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-07) trains, as the "
        "project's Adam"
    )
    clipped = load(f"{MODELS}:clipped")  # never silently: an optimizer the project's cannot be is named, set aside
    assert clipped.optimizer is None and clipped.objective.endswith(
        "the compiled optimizer Adam(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-07, global_clipnorm=1) "
        "is set aside: the optimizer above trains (--optimizer, --learning-rate; --fit trains with yours)"
    )
    binary = load(f"{MODELS}:binary")
    assert (binary.targets, binary.label_shape, binary.binary_threshold) == ("binary", (1,), 0.0)
    assert binary.loss_name == "BinaryCrossentropy(from_logits=True)"


def test_the_targets_are_checked_in_the_data_in_one_line_that_names_the_loss(tmp_path):
    regression, binary = load(f"{MODELS}:regression"), load(f"{MODELS}:binary")
    taken = npz.labels("d.npz", "y_train", np.array([0.5, -2.0], np.float64), regression, "float64")
    assert taken.shape == (2, 1) and taken.dtype == np.float64  # [N] for one unit; float64 kept in a float64 run
    for y, model, message in (
        (
            np.zeros((2, 3), np.float32),
            regression,
            "--data d.npz: y_train has shape [2, 3]; the loss mse takes float targets of the output's shape [N, 1]",
        ),
        (
            np.array([0.0, np.nan]),
            regression,
            "--data d.npz: y_train holds NaN or inf, first in example 1; the loss mse takes float targets of the "
            "output's shape [N, 1]",
        ),
        (
            np.array([0, 2]),
            binary,
            "--data d.npz: y_train holds 2 (example 1); the loss BinaryCrossentropy(from_logits=True) takes 0/1 "
            "labels of the output's shape [N, 1], each 0 to 1",
        ),
    ):
        with pytest.raises(UsageError) as error:
            npz.labels("d.npz", "y_train", y, model)
        assert str(error.value) == message


def test_a_regression_on_mnist_is_refused_in_one_line():
    with pytest.raises(UsageError, match="is trained with the loss mse on values targets .N, 1., not MNIST's class"):
        check_model(f"{MODELS}:regression", trainers=("dtensor",), devices=4, meshes=("batch=4",), epochs=1)


@pytest.mark.parametrize(
    "function, kind",
    # binary cross-entropy's compiled loss on every trainer: extended, for CI's minutes
    [
        ("regression", "values"),
        pytest.param("binary", "binary", marks=pytest.mark.extended),
        ("regularized", "classes"),
    ],
)
def test_a_compiled_model_is_ok_on_every_trainer_in_float64(data, function, kind):
    result = check_model(
        f"{MODELS}:{function}", meshes=("batch=4", "batch=2,model=2"), devices=4, data=data[kind], **UNEVEN
    )
    assert result.ok, result.summary()
    assert set(result.verdicts) == {"dtensor batch=4", "dtensor batch=2,model=2", "mirrored"}
    assert max(parity.max_abs_loss_diff for parity in result.parity.values()) < 1e-13


def expected_first_loss(path: str, function: str, penalty: bool = True) -> float:
    """A model's first step's loss on the host, in float64: the cross-entropy of the first batch at the initial
    values, plus its penalty of 0.1 (float32's: Keras holds the factor as a float32 tensor, in a float64 model too)
    times the sum of squares of the hidden kernel ("regularized") or of the hidden layer's outputs over the batch's
    examples, divided by their count ("activity", Keras's activity regularizer)."""
    definition = load(f"{MODELS}:{function}", seed=22)  # the run's seed: what the Keras model is built from
    values = dict(zip(definition.names, definition.initial_values(22, "float64")))
    with np.load(path) as arrays:
        x, y = arrays["x_train"][:48].astype(np.float64), arrays["y_train"][:48]
    hidden = np.maximum(x @ values["hidden/kernel"] + values["hidden/bias"], 0)
    logits = hidden @ values["out/kernel"] + values["out/bias"]
    logits = logits - logits.max(axis=1, keepdims=True)
    cross_entropy = np.mean(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(48), y])
    squares = np.sum(values["hidden/kernel"] ** 2) if function == "regularized" else np.sum(hidden**2) / len(x)
    return cross_entropy + penalty * float(np.float32(0.1)) * squares


def assert_first_losses_carry_the_penalty(result, path: str, function: str) -> None:
    with_penalty, without = expected_first_loss(path, function), expected_first_loss(path, function, False)
    assert with_penalty - without > 0.01  # the penalty is no rounding
    for name, trained in result.run.results.items():
        assert trained.history.step_losses[0] == pytest.approx(with_penalty, rel=1e-12), name


# 4 replicas: the compiled regularized model above on batch=4 and under MirroredStrategy on 4 as well.
@pytest.mark.parametrize("devices", [2, pytest.param(4, marks=pytest.mark.extended)])
def test_the_regularization_is_added_once_a_step_on_any_replica_count(data, devices):
    result = check_model(
        f"{MODELS}:regularized", meshes=(f"batch={devices}",), devices=devices, data=data["classes"], **UNEVEN
    )
    assert result.ok, result.summary()
    assert len(result.run.results) == 3  # the reference, DTensor and MirroredStrategy
    assert_first_losses_carry_the_penalty(result, data["classes"], "regularized")


@pytest.mark.parametrize("devices", [2, pytest.param(4, marks=pytest.mark.extended)])  # 2: unequal pieces too
def test_a_loss_of_the_examples_is_weighed_by_each_replicas_share(data, devices):
    """Keras's activity regularizer is a mean over the examples a forward sees: each replica's weighed by its share
    of the global batch sums to the global batch's, unequal pieces (the last batch's) included."""
    result = check_model(f"{MODELS}:activity", trainers=("mirrored",), devices=devices, data=data["classes"], **UNEVEN)
    assert result.ok, result.summary()
    assert result.parity["mirrored"].max_abs_loss_diff < 1e-13
    assert_first_losses_carry_the_penalty(result, data["classes"], "activity")
    (caution,) = load(f"{MODELS}:activity").cautions  # DTensor's padding examples would count: said before training
    assert caution.trainers == ("dtensor", "mirrored")
    assert caution.text.startswith("the model adds losses computed from its examples (an activity regularizer")


def test_a_regression_shows_its_loss_and_no_accuracy(data, tmp_path):
    report = tmp_path / "report.json"
    result = run_here(
        "--model", f"{MODELS}:regression", "--data", data["values"], "--devices", "2", "--dtype", "float64",
        "--epochs", "1", "--batch-size", "48", "--trainers", "reference,mirrored", "--json", str(report),
        "--trainer-process", "shared",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    table = result.stdout.split("Results after the last epoch\n", 1)[1].splitlines()[0]
    assert "train loss" in table and "test loss" in table and "acc" not in table
    epoch_lines = [line for line in result.stdout.splitlines() if " epoch 1/1 " in line]
    assert len(epoch_lines) == 2 and all("  train_acc -  " in line and "  test_acc -  " in line for line in epoch_lines)
    assert "objective: the compiled loss mse on float targets, per example, averaged over the global batch" in (
        " ".join(line.strip() for line in result.stdout.splitlines())
    )
    written = check_report(json.loads(report.read_text()))
    assert (written["model"]["targets"], written["model"]["loss"], written["model"]["classes"]) == ("values", "mse", 1)


def linear_regression():
    """An own-interface model of float targets: one unit, the default mean squared error."""
    from dtensor_vs_mirrored.shared.model.definition import ModelDefinition, Variable, truncated_normal

    return ModelDefinition(
        name="linear regression",
        variables=(Variable("w", (8, 1), truncated_normal(0.5, 1)), Variable("b", (1,))),
        forward=lambda variables, x: tf.matmul(x, variables["w"]) + variables["b"],
        flops_per_example=6 * 9,
        input_shape=(8,),
        label_shape=(1,),
        targets="values",
    )


def test_a_model_of_the_projects_interface_declares_float_targets_too(data):
    result = check_model(linear_regression, meshes=("batch=4",), devices=4, data=data["values"], **UNEVEN)
    assert result.ok, result.summary()
    assert max(parity.max_abs_loss_diff for parity in result.parity.values()) < 1e-13
    history = result.run.results["reference"].history
    assert history.epochs[-1].train_accuracy == 0.0 and history.step_losses[0] > 0.1  # a squared error, no accuracy


def test_a_compiled_adams_schedule_and_moments_train_as_the_projects_adam_per_step():
    from dtensor_vs_mirrored.shared.config import Config
    from dtensor_vs_mirrored.shared.training.optim import adam_update, make_optimizer

    choice = load(f"{MODELS}:cosine").optimizer
    assert (choice.name, choice.beta_1, choice.beta_2, choice.epsilon) == ("adam", 0.9, 0.999, 1e-7)
    weight = tf.Variable(tf.constant([1.0, -2.0], tf.float64))
    optimizer = make_optimizer(
        Config(optimizer="sgd", learning_rate=123.0), [weight], lambda v: tf.Variable(tf.zeros_like(v)),
        lambda: tf.Variable(0, tf.int64), choice=choice,
    )  # fmt: skip
    expected, m, v = np.array([1.0, -2.0]), np.zeros(2), np.zeros(2)
    for step, gradient in enumerate(([0.5, 0.25], [-1.0, 2.0], [0.125, -0.5])):
        optimizer.apply_gradients([tf.constant(gradient, tf.float64)], [weight])
        rate = float(np.float32(0.01 * 0.5 * (1 + np.cos(np.pi * step / 100))))  # CosineDecay(0.01, 100) at step
        update = adam_update(np.array(gradient), m, v, tf.constant(step + 1.0, tf.float64), rate)
        decrease, m, v = (np.asarray(t) for t in update)
        expected = expected - decrease
        # within float32's rounding of the rate (Keras's schedule computes in float32): the next step's rate moves
        # the weights by 2.5e-6
        assert weight.numpy() == pytest.approx(expected, abs=1e-8), step
    assert rate < 0.01 and rate != pytest.approx(0.01, rel=1e-4)  # the schedule moved the rate


def test_the_header_names_the_compiled_optimizer_that_trains():
    from dtensor_vs_mirrored.shared.config import Config
    from dtensor_vs_mirrored.shared.report.header import describe_training

    line = describe_training(Config(model=f"{MODELS}:cosine", dtype="float64"))
    assert line == (
        "adam the model's compiled Adam(learning_rate=CosineDecay, beta_1=0.9, beta_2=0.999, epsilon=1e-07) (fixed "
        "Adam); float64; seed 22"
    )
