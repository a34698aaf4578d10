"""--fit: Keras's own model.fit on one device (the reference) and under MirroredStrategy, judged step by step.
Each step's loss is the batch's own as Keras computed it; the pre-run check lists Keras's causes that apply;
what --fit cannot run is one line. The probe's models and their verdicts: examples/test_keras_fit.py."""

import numpy as np
import pytest

pytest.importorskip(
    "keras",
    minversion="3",
    reason="Keras models need Keras 3 (TensorFlow 2.16 or later); this TensorFlow brings Keras 2",
)
import tensorflow as tf

from dtensor_vs_mirrored.mirrored_impl.fit_cautions import fit_cautions, rebatch_pieces
from dtensor_vs_mirrored.shared import cli as compare
from dtensor_vs_mirrored.shared.api import check_model
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.judge.verdict import OK
from dtensor_vs_mirrored.shared.model.registry import definition_for
from dtensor_vs_mirrored.shared.report.header import describe_training
from dtensor_vs_mirrored.shared.run.fit_options import check_fit_options
from dtensor_vs_mirrored.shared.training import registry
from dtensor_vs_mirrored.shared.training.batches import epoch_batches
from dtensor_vs_mirrored.shared.training.data import load_run_data
from dtensor_vs_mirrored.shared.training.keras_fit import check_fit_model, fit_model

EXAMPLE = "examples/keras_fit.py"
MISTAKES = "tests/models/keras_mistakes.py"


def test_tf_data_cuts_a_batch_into_pieces_of_its_ceiling_share_the_last_the_rest():
    assert rebatch_pieces(64, 4) == [16, 16, 16, 16]
    assert rebatch_pieces(44, 8) == [6, 6, 6, 6, 6, 6, 6, 2]
    assert rebatch_pieces(3, 4) == [1, 1, 1, 0]


def test_each_steps_loss_is_the_batchs_own_as_keras_computed_it_a_partial_last_one_too(devices):
    """Not Keras's running mean: step 1, a partial batch of 36, records its own loss, and an uncompiled model
    trains with the tool's Adam and softmax cross-entropy."""
    config = Config(
        model=f"{MISTAKES}:uncompiled", fit=True, data="embedded", train_examples=100, test_examples=64,
        batch_size=64, epochs=1, dtype="float64", trainers=("reference",), quiet=True,
    )  # fmt: skip
    data = load_run_data(config)
    history = registry.fit("reference", config, data, devices[:1])
    with tf.device(devices[0]):
        model = fit_model(definition_for(config), config)
        expected = []
        for x, y in epoch_batches(data.x_train, data.y_train, config.batch_size):
            logits = model(x, training=True)
            expected.append(float(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))))
            model.train_on_batch(x, y)
    assert len(history.step_losses) == 2
    np.testing.assert_allclose(history.step_losses, expected, rtol=0, atol=1e-14)
    assert history.details["compile"] == (
        "compiled by the tool: adam lr 0.001, SparseCategoricalCrossentropy(from_logits=True)"
    )


def test_the_pre_run_check_lists_keras_s_causes_that_apply_to_the_compile_settings_and_batches():
    config = Config(model=f"{EXAMPLE}:batch_norm", fit=True, batch_size=64)
    bn, pieces, metrics = fit_cautions(config, train_examples=100)  # 8 replicas: a last batch of 36
    assert bn.text.startswith("bn: batch norm per replica: Keras BatchNormalization without synchronized=True")
    assert pieces.text.startswith(
        "unequal pieces: the last batch of 36 in pieces of 5, 5, 5, 5, 5, 5, 5, 1 over 8 replicas; Keras's loss is "
        "each replica's mean divided by 8 (loss reduction per replica)"
    )
    assert metrics.text.startswith("metrics per replica: Keras reports the compiled metrics (accuracy) as the mean")
    assert (bn.trainers, bn.in_reason, metrics.in_reason) == (("mirrored",), True, False)
    (clipping, _) = fit_cautions(Config(model=f"{EXAMPLE}:clipnorm", fit=True, devices=4, batch_size=64), 256)
    assert clipping.text.startswith(
        "the optimizer's clipnorm=0.01: clipping before the all-reduce: under MirroredStrategy Keras clips each "
        "replica's part of the gradient"
    )
    assert fit_cautions(Config(model=f"{MISTAKES}:uncompiled", fit=True, devices=4, batch_size=64), 256) == ()
    assert describe_training(Config(model=f"{EXAMPLE}:global_clipnorm", fit=True, dtype="float64")) == (
        "Keras model.fit (--fit): the reference on one device, mirrored under MirroredStrategy; compiled by your "
        "function: Adam lr 0.01, global_clipnorm=0.01; loss SparseCategoricalCrossentropy(from_logits=True); "
        "float64; seed 22"
    )


def test_fit_trains_the_reference_and_mirrored_by_default():
    from dtensor_vs_mirrored.shared.training.registry import chosen

    assert chosen(Config(model=f"{EXAMPLE}:plain", fit=True)) == ("reference", "mirrored")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"model": "mlp"}, "--fit trains a Keras model with its own model.fit; give --model FILE.py:FUNCTION"),
        (
            {"trainers": ("reference", "dtensor")},
            "--fit trains Keras's model.fit, which has no DTensor path (keras-team/keras#18473); drop dtensor",
        ),
        ({"clip_global_norm": 1.0}, "--clip-global-norm clips the project's own trainers; under --fit the model's"),
        ({"profile": True}, "--profile does not apply to --fit (Keras's model.fit trains there); drop it"),
        ({"clients": 2}, "--fit with --clients 2: Keras 3's model.fit fails under MultiWorkerMirroredStrategy"),
    ],
)
def test_what_fit_cannot_run_is_one_line(options, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        check_fit_options(Config(**{"model": f"{EXAMPLE}:plain", "fit": True, **options}))


def test_the_command_line_and_check_model_refuse_what_fit_cannot_run_in_the_same_words(capsys):
    """Config makes --fit with dtensor (the rule names trainers, so it runs where a run starts, not in Config):
    compare.py and check_model refuse it before anything trains, in their own terms."""
    assert compare.main(["--model", f"{EXAMPLE}:plain", "--fit", "--trainers", "reference,dtensor"]) == 2
    assert capsys.readouterr().err == (
        "compare.py: error: --fit trains Keras's model.fit, which has no DTensor path (keras-team/keras#18473); "
        "drop dtensor from --trainers\n"
    )
    with pytest.raises(UsageError) as refused:
        check_model(f"{EXAMPLE}:plain", trainers=("dtensor",), fit=True, devices=2)
    assert str(refused.value) == (
        "fit=True trains Keras's model.fit, which has no DTensor path (keras-team/keras#18473); drop dtensor "
        "from trainers"
    )


def test_a_model_fit_cannot_train_is_one_line():
    with pytest.raises(UsageError, match="--fit trains a Keras model with its own model.fit; --model examples/my_mo"):
        check_fit_model(Config(model="examples/my_model.py:my_model", fit=True))
    with pytest.raises(UsageError, match="compiled with steps_per_execution=4, and each step's loss is recorded"):
        check_fit_model(Config(model=f"{MISTAKES}:several_steps_per_call", fit=True))


# extended: the cautions' texts are asserted above without training; this trains 8 replicas.
@pytest.mark.extended
def test_a_partial_last_batch_in_unequal_pieces_is_a_mismatch_at_that_step_naming_the_cause():
    from dtensor_vs_mirrored.shared.api import check_model

    result = check_model(
        f"{EXAMPLE}:plain", fit=True, devices=8, dtype="float64", epochs=1, batch_size=64, train_examples=100,
        test_examples=64, trainer_process="shared",
    )  # fmt: skip
    mirrored = result.verdicts["mirrored"]
    assert mirrored.line().startswith("MISMATCH at step 1: loss; after its update every variable and Adam slot")
    assert "unequal pieces: the last batch of 36 in pieces of 5, 5, 5, 5, 5, 5, 5, 1 over 8 replicas" in mirrored.reason
    assert "metrics per replica" not in mirrored.reason  # logs only: never in a reason


FLOAT64 = "tests/models/keras_fit_float64.py"
SMALL_FIT = {"data": "embedded", "train_examples": 256, "test_examples": 128, "epochs": 1, "batch_size": 64}


def test_a_loss_given_by_name_computes_in_float64_in_a_float64_fit():
    """Keras builds a named loss at the first fit, in float32 floatx: before the tool resolved it, one device and
    MirroredStrategy differed by float32's rounding (1.2e-7 here); in float64 they agree to 1e-12."""
    from dtensor_vs_mirrored.shared.api import check_model

    check = check_model(f"{FLOAT64}:softmax_string_loss", fit=True, devices=2, dtype="float64", **SMALL_FIT)
    parity = check.parity["mirrored"]
    assert check.verdicts["mirrored"].verdict == OK and parity.steps == 4
    assert parity.max_abs_loss_diff <= 1e-12 and parity.max_abs_weight_diff <= 1e-12, parity


def test_a_metric_with_no_float64_kernel_computes_on_a_float32_cast_and_fails_nothing():
    from dtensor_vs_mirrored.shared.api import check_model

    check = check_model(f"{FLOAT64}:top_k_metric", fit=True, devices=2, dtype="float64", **SMALL_FIT)
    assert check.errors == {} and check.verdicts["mirrored"].verdict == OK, check.errors
    assert check.parity["mirrored"].max_abs_loss_diff <= 1e-12


@pytest.mark.parametrize("function, kind", [("binary", "binary"), ("regression", "values")])
def test_fit_counts_the_accuracy_the_projects_trainers_count(tmp_path, devices, function, kind):
    """--fit's accuracy is the project's: a binary output above its threshold (a sparse categorical accuracy
    before: a one-unit output's arg-max is always 0, test_acc 26 on this data), none (0) for a regression; the
    same figures as the project's own reference training the compiled model in float64 (the same weights)."""
    from tests.models.keras_objectives import write_data

    data_path = write_data(str(tmp_path / f"{kind}.npz"), kind)
    options = dict(model=f"tests/models/keras_objectives.py:{function}", data=data_path, dtype="float64", epochs=2)
    options.update(batch_size=64, trainers=("reference",), quiet=True)
    histories = []
    for fit in (True, False):
        config = Config(fit=fit, **options)
        histories.append(registry.fit("reference", config, load_run_data(config), devices[:1]))
    for fitted, own in zip(*(history.epochs for history in histories), strict=True):
        assert 0 <= fitted.test_accuracy <= 1 and (kind == "binary" or fitted.test_accuracy == 0)
        assert (fitted.train_accuracy, fitted.test_accuracy) == (own.train_accuracy, own.test_accuracy)
