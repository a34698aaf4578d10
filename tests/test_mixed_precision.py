"""--dtype mixed_bfloat16 / mixed_float16: float32 weights, the forward and backward in the low precision, the loss
and the combining in float32; mixed_float16's dynamic loss scaling; the mixed tolerances and their float32 rerun."""

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from dtensor_vs_mirrored.shared.api import check_model
from dtensor_vs_mirrored.shared.config import MIXED_COMPUTE, Config
from dtensor_vs_mirrored.shared.judge.parity import tolerances
from dtensor_vs_mirrored.shared.model.blocks import attention
from dtensor_vs_mirrored.shared.model.definition import Model, ModelDefinition, Variable
from dtensor_vs_mirrored.shared.model.mlp import mlp
from dtensor_vs_mirrored.shared.model.registry import definition_for
from dtensor_vs_mirrored.shared.report.header import describe_model
from dtensor_vs_mirrored.shared.training.loss_scale import GROWTH_STEPS, loss_scale_of, loss_scale_record
from dtensor_vs_mirrored.shared.training.optim import SGD, Adam
from tests.cli import SMALL, read_report, run_compare, run_here

# Whether this CPU's kernels (as ONEDNN_MAX_CPU_ISA leaves them) compute a bfloat16 and a float16 matmul and its
# gradient: capped at AVX2 or SSE41, TensorFlow 2.21's oneDNN kills the process (SIGSEGV) on the bfloat16 one.
LOW_PRECISION_MATMUL = """
import tensorflow as tf
for dtype in (tf.bfloat16, tf.float16):
    w = tf.Variable(tf.ones((8, 8)))
    with tf.GradientTape() as tape:
        y = tf.cast(tf.matmul(tf.ones((4, 8), dtype), tf.cast(w, dtype)), tf.float32)
    tape.gradient(y, w).numpy()
"""


def low_precision_runs_here() -> bool:
    probe = subprocess.run([sys.executable, "-c", LOW_PRECISION_MATMUL], capture_output=True, timeout=120)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(
    not low_precision_runs_here(),
    reason="this CPU's kernels crash on a bfloat16 matmul (try without ONEDNN_MAX_CPU_ISA)",
)

MIXED_SMALL = dict(train_examples=512, test_examples=256, epochs=1, devices=2, trainer_process="shared")


def test_the_forward_computes_in_bfloat16_from_float32_weights_and_hands_back_float32_logits():
    definition = mlp((16,))
    values = definition.initial_values(seed=3)
    model = Model(definition, values, compute_dtype="bfloat16")
    x = tf.constant(np.random.default_rng(0).random((4, 784)), tf.float32)
    with tf.GradientTape() as tape:
        logits = model(x)
        total = tf.reduce_sum(logits)
    gradients = tape.gradient(total, model.trainable)
    low = [tf.cast(value, tf.bfloat16) for value in values]
    hidden = tf.nn.relu(tf.matmul(tf.cast(x, tf.bfloat16), low[0]) + low[1])
    expected = tf.cast(tf.matmul(hidden, low[2]) + low[3], tf.float32)
    assert logits.dtype == tf.float32 and all(g.dtype == tf.float32 for g in gradients)
    assert all(weight.dtype == tf.float32 for weight in model.weights)
    np.testing.assert_array_equal(logits.numpy(), expected.numpy())  # bit for bit: the same bfloat16 ops
    float32 = Model(definition, values)(x).numpy()
    assert 1e-4 < np.max(np.abs(float32 - logits.numpy())) < 0.1  # bfloat16's rounding, not float32's


def test_a_forward_that_takes_a_context_is_told_its_compute_dtype():
    seen = []

    def forward(variables, x, context):
        seen.append(context.compute_dtype)
        return tf.matmul(x, variables["w"])

    definition = ModelDefinition("told", (Variable("w", (3, 2)),), forward, 12, input_shape=(3,), classes=2)
    Model(definition, definition.initial_values(0), compute_dtype="float16")(tf.ones([1, 3]))
    Model(definition, definition.initial_values(0))(tf.ones([1, 3]))
    assert seen == [tf.float16, tf.float32]


# mixed_float16 extended: its loss scaling on every trainer is the default's skipped-steps test's path.
@pytest.mark.parametrize("policy", ["mixed_bfloat16", pytest.param("mixed_float16", marks=pytest.mark.extended)])
def test_every_trainer_and_mesh_matches_the_mixed_reference_within_its_tolerance(policy):
    result = check_model("mlp", meshes=("batch=2", "batch=1,model=2"), hidden=(64, 32), dtype=policy, **MIXED_SMALL)
    assert result.ok, result.summary()
    assert {name: v.verdict for name, v in result.verdicts.items()} == dict.fromkeys(
        ("dtensor batch=2", "dtensor batch=1,model=2", "mirrored"), "ok"
    )
    for name, trainer in result.run.results.items():
        assert trainer.history.dtype == policy, name
        assert trainer.history.skipped_steps == (0 if policy == "mixed_float16" else None), name
    assert max(parity.max_abs_loss_diff for parity in result.parity.values()) < tolerances(policy)["loss"].atol


def test_sharded_weights_compute_in_bfloat16_too():
    result = check_model(
        "mlp", meshes=("batch=2",), hidden=(64, 32), dtype="mixed_bfloat16", shard_weights=True, **MIXED_SMALL
    )
    assert result.ok, result.summary()


def loss_scaled_optimizer(make, weights):
    step = lambda: tf.Variable(0, dtype=tf.int64)  # noqa: E731
    if make is SGD:
        return SGD(0.1, step, loss_scaled=True)
    return Adam(weights, 0.1, lambda v: tf.Variable(tf.zeros_like(v)), step, loss_scaled=True)


@pytest.mark.parametrize("make", [SGD, Adam])
def test_a_non_finite_gradient_skips_the_step_and_halves_the_scale_as_keras_does(make):
    weights = [tf.Variable([1.0, 1.0])]
    optimizer = loss_scaled_optimizer(make, weights)
    assert float(loss_scale_of(optimizer)) == 2.0**15
    optimizer.apply_gradients([tf.constant([1.0, 1.0])], weights)
    taken = weights[0].numpy().copy()
    slots = [slot[0].numpy().copy() for slot in (optimizer.m, optimizer.v)] if make is Adam else []
    optimizer.apply_gradients([tf.constant([np.inf, 1.0])], weights)
    np.testing.assert_array_equal(weights[0].numpy(), taken)  # skipped: weights unchanged
    assert float(loss_scale_of(optimizer)) == 2.0**14 and int(optimizer.step.numpy()) == 1
    for slot, before in zip((getattr(optimizer, "m", None), getattr(optimizer, "v", None)), slots):
        np.testing.assert_array_equal(slot[0].numpy(), before)  # skipped: Adam's slots unchanged, finite
    assert loss_scale_record(optimizer) == "loss scale 16384, 1 of 2 steps skipped (non-finite gradient)"


def test_the_scale_doubles_after_2000_finite_steps_in_a_row():
    weights = [tf.Variable([1.0])]
    optimizer = loss_scaled_optimizer(SGD, weights)

    @tf.function
    def steps(count):
        for _ in tf.range(count):
            optimizer.apply_gradients([tf.constant([0.0])], weights)

    steps(GROWTH_STEPS - 1)
    assert float(loss_scale_of(optimizer)) == 2.0**15
    steps(1)
    assert float(loss_scale_of(optimizer)) == 2.0**16 and int(optimizer.loss_scale.finite_steps.numpy()) == 0


def overflowing():
    """An MLP whose logits are multiplied by 3000: at the scale 2**15 its float16 backward overflows, so loss
    scaling halves the scale and skips steps until the gradient is finite."""
    definition = mlp((32,))

    def forward(variables, images, context):
        return definition.forward(variables, images, context) * tf.constant(3000.0, context.compute_dtype)

    return dataclasses.replace(definition, forward=forward, name="overflowing mlp 784-32-10")


def test_every_trainer_skips_the_steps_the_reference_skips_on_the_combined_gradient():
    result = check_model(overflowing, meshes=("batch=2",), dtype="mixed_float16", learning_rate=1e-5, **MIXED_SMALL)
    skipped = {name: trainer.history.skipped_steps for name, trainer in result.run.results.items()}
    assert skipped["reference"] > 0 and set(skipped.values()) == {skipped["reference"]}, skipped
    assert result.ok, result.summary()


@pytest.mark.parametrize("policy,tolerance", [("mixed_bfloat16", 2.0**-6), ("mixed_float16", 2.0**-9)])
def test_each_mixed_policy_is_judged_at_four_epsilon_of_its_compute_dtype(policy, tolerance):
    bounds = tolerances(policy)
    assert bounds["loss"].atol == bounds["loss"].rtol == tolerance and bounds["weight"].atol == 10 * tolerance


@pytest.mark.extended  # the same explanation for bfloat16 stays default (the test below)
def test_a_mixed_float16_difference_beyond_its_tolerance_is_fp16_noise_in_the_last_line(tmp_path):
    report_path = tmp_path / "report.json"
    result = run_here(
        *SMALL, "--hidden", "64,32", "--dtype", "mixed_float16", "--tolerance", "1e-9", "--json", str(report_path)
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert result.stdout.rstrip().endswith("PARITY OK (fp16 noise: dtensor, mirrored)")
    report = read_report(report_path)
    assert {name: entry["verdict"] for name, entry in report["parity"].items()} == {
        "dtensor": "fp16 noise",
        "mirrored": "fp16 noise",
    }
    assert report["config"]["dtype"] == "mixed_float16" and report["trainers"]["dtensor"]["skipped_steps"] == 0


def test_a_mixed_difference_beyond_its_tolerance_is_bf16_noise_when_float32_agrees():
    result = check_model(
        "mlp", meshes=("batch=2",), hidden=(64, 32), dtype="mixed_bfloat16", tolerance=1e-9, **MIXED_SMALL
    )
    assert result.ok, result.summary()
    for name, verdict in result.verdicts.items():
        assert verdict.verdict == "bf16 noise", (name, verdict.line())
        step = verdict.float32_left_tolerance_step
        assert verdict.summary == (
            f"mixed_bfloat16 (bfloat16 compute) left its tolerance at step {step}; float32 agrees on all 4 steps"
        )


# extended: the stale read itself is shown by default (tests/test_releases.py); 14 s of CI's minutes.
@pytest.mark.extended
def test_the_tutorial_adam_stays_a_mismatch_in_mixed_bfloat16(tmp_path):
    report_path = tmp_path / "report.json"
    result = run_compare(
        *SMALL,
        "--train-examples",
        "512",
        "--trainers",
        "dtensor",
        "--adam",
        "tutorial",
        "--dtype",
        "mixed_bfloat16",
        "--json",
        str(report_path),
        env={"DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION": "1"},
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert read_report(report_path)["parity"]["dtensor"]["verdict"] == "MISMATCH"
    assert "float32 rerun of reference, dtensor" in result.stdout  # then float64's: the tutorial's stale reads
    assert "float64 rerun of reference, dtensor" in result.stdout


KERAS_MIXED = "tests/models/keras_mixed.py"


def keras_forward(model: str, dtype: str, x):
    """The definition's logits for `x` as every trainer computes them under `dtype`, and the Keras model."""
    definition = definition_for(Config(model=f"{KERAS_MIXED}:{model}", dtype=dtype))
    compute = MIXED_COMPUTE.get(dtype)
    return Model(definition, definition.initial_values(seed=0), compute_dtype=compute)(x), definition.keras_model


def test_a_keras_model_with_mixed_bfloat16_layers_computes_as_keras_computes_it():
    x = tf.constant(np.random.default_rng(0).normal(size=(8, 20)), tf.float32)
    logits, keras_model = keras_forward("bfloat16_mlp", "mixed_bfloat16", x)
    assert keras_model.get_layer("hidden").dtype_policy.name == "mixed_bfloat16"
    assert describe_model(definition_for(Config(model=f"{KERAS_MIXED}:bfloat16_mlp"))).endswith(
        "layers under mixed_bfloat16 (--dtype mixed_bfloat16 trains it as it is; another --dtype, a copy rebuilt with "
        "every layer under it); 804 parameters, 0.00 MFLOP per example (forward + backward)"
    )
    np.testing.assert_array_equal(logits.numpy(), keras_model(x).numpy())  # the model as it is: bit for bit
    float32, _ = keras_forward("bfloat16_mlp", "float32", x)  # --dtype float32: a float32 copy
    assert 1e-4 < np.max(np.abs(float32.numpy() - logits.numpy())) < 0.1


def test_mixed_float16_on_a_float32_keras_model_computes_with_a_copy_under_the_policy():
    import keras

    from tests.models.keras_mixed import mlp

    x = tf.constant(np.random.default_rng(0).normal(size=(8, 20)), tf.float32)
    logits, keras_model = keras_forward("float32_mlp", "mixed_float16", x)
    assert keras_model.get_layer("hidden").dtype_policy.name == "float32"  # the user's model is untouched
    under_policy = mlp("mixed_float16", "mixed_float16")
    under_policy.set_weights(keras_model.get_weights())
    expected = keras.ops.cast(under_policy(x), "float32")
    assert logits.dtype == tf.float32 and under_policy.get_layer("out").kernel.dtype == "float32"
    np.testing.assert_array_equal(logits.numpy(), np.asarray(expected))


KERAS_SMALL = dict(epochs=1, devices=2, batch_size=64, trainer_process="shared")


@pytest.mark.parametrize("model,policy", [("bfloat16_mlp", "mixed_bfloat16"), ("float32_mlp", "mixed_float16")])
def test_a_keras_model_trains_mixed_on_every_trainer_and_mesh(tmp_path, model, policy):
    from tests.models.keras_mixed import write_normal

    write_normal(str(tmp_path / "data.npz"))
    result = check_model(
        f"{KERAS_MIXED}:{model}",
        meshes=("batch=2", "batch=1,model=2"),
        dtype=policy,
        data=str(tmp_path / "data.npz"),
        **KERAS_SMALL,
    )
    assert result.ok, result.summary()
    assert set(v.verdict for v in result.verdicts.values()) == {"ok"}, result.summary()
    for name, trainer in result.run.results.items():
        assert trainer.history.dtype == policy, name
        assert trainer.history.skipped_steps == (0 if policy == "mixed_float16" else None), name
    assert max(parity.max_abs_loss_diff for parity in result.parity.values()) < tolerances(policy)["loss"].atol


def test_the_causal_mask_stays_finite_in_float16():
    """1e9 is float16's infinity: the GPT's masked scores were inf - inf = NaN before the mask was capped."""
    width, heads, head_dim = 4, 2, 2
    names = ("query", "key", "value")
    v = {f"b/{name}": tf.ones([width, heads, head_dim], tf.float16) * 0.1 for name in names}
    v.update({f"b/{name}_bias": tf.zeros([heads, head_dim], tf.float16) for name in names})
    v.update(
        {
            "b/output": tf.ones([heads, head_dim, width], tf.float16) * 0.1,
            "b/output_bias": tf.zeros([width], tf.float16),
        }
    )
    out = attention(v, "b/", tf.ones([1, 3, width], tf.float16), causal=True)
    assert out.dtype == tf.float16 and bool(tf.reduce_all(tf.math.is_finite(out)))


@pytest.mark.extended  # bf16 noise: the MLP's test above; a Keras model mixed: the one before
def test_a_keras_mixed_model_beyond_its_tolerance_is_bf16_noise_and_its_float64_copy_matches(tmp_path):
    """The wider reruns of a model built under mixed_bfloat16 train its copies: float32 (the noise verdict), and
    float64 (every layer's policy float64)."""
    from tests.models.keras_mixed import write_normal

    write_normal(str(tmp_path / "data.npz"))
    common = dict(meshes=("batch=2",), data=str(tmp_path / "data.npz"), **KERAS_SMALL)
    noisy = check_model(f"{KERAS_MIXED}:bfloat16_mlp", dtype="mixed_bfloat16", tolerance=1e-9, **common)
    assert {name: verdict.verdict for name, verdict in noisy.verdicts.items()} == {
        "dtensor batch=2": "bf16 noise",
        "mirrored": "bf16 noise",
    }, noisy.summary()
    wide = check_model(f"{KERAS_MIXED}:bfloat16_mlp", dtype="float64", **common)
    assert wide.ok and max(parity.max_rel_loss_diff for parity in wide.parity.values()) <= 1e-12, wide.summary()
