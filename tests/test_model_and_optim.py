"""Initial values, loss, and Adam/SGD against an independent NumPy implementation."""

import numpy as np
import pytest
import tensorflow as tf

from dtensor_vs_mirrored.shared.model.definition import Model
from dtensor_vs_mirrored.shared.model.mlp import layer_sizes, mlp, parameter_count
from dtensor_vs_mirrored.shared.training.losses import correct_count, mean_loss
from dtensor_vs_mirrored.shared.training.optim import SGD, Adam

TUTORIAL_SIZES = (784, 700, 500, 10)


def initial_values(sizes, seed):
    return mlp(sizes[1:-1]).initial_values(seed)


def test_sizes_and_parameter_count():
    assert layer_sizes((700, 500)) == TUTORIAL_SIZES
    # 784*700+700 + 700*500+500 + 500*10+10, the model the tutorial meant (not 784-700-10-10).
    assert parameter_count(TUTORIAL_SIZES) == 905_010 == mlp().parameter_count()
    assert mlp().name == "mlp 784-700-500-10" and mlp().flops_per_example == 3 * 2 * (784 * 700 + 700 * 500 + 5000)
    values = initial_values(TUTORIAL_SIZES, 22)
    assert [v.shape for v in values] == [(784, 700), (700,), (700, 500), (500,), (500, 10), (10,)]
    assert sum(v.size for v in values) == 905_010


def test_initial_values_are_xavier_uniform_and_reproducible():
    values = initial_values(TUTORIAL_SIZES, 22)
    for (fan_in, fan_out), weight, bias in zip(
        zip(TUTORIAL_SIZES[:-1], TUTORIAL_SIZES[1:]), values[0::2], values[1::2]
    ):
        limit = np.sqrt(6.0) / np.sqrt(fan_in + fan_out)
        assert np.abs(weight).max() <= limit and np.abs(weight).max() > 0.99 * limit
        # Uniform on [-limit, limit]: mean 0, standard deviation limit / sqrt(3).
        assert abs(weight.mean()) < 0.02 * limit
        assert weight.std() == pytest.approx(limit / np.sqrt(3), rel=0.02)
        np.testing.assert_array_equal(bias, 0.0)
    again = initial_values(TUTORIAL_SIZES, 22)
    for a, b in zip(values, again):
        np.testing.assert_array_equal(a, b)
    other = initial_values(TUTORIAL_SIZES, 23)
    assert not np.array_equal(values[0], other[0])
    # The tutorial's exact draw: stateless_uniform with seed (22, 23).
    limit = tf.sqrt(6.0) / tf.sqrt(tf.cast(784 + 700, tf.float32))
    expected = tf.random.stateless_uniform((784, 700), seed=(22, 23), minval=-limit, maxval=limit)
    np.testing.assert_array_equal(values[0], expected.numpy())


def test_loss_is_sum_over_real_examples_divided_by_global_count():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 10)).astype(np.float32)
    labels = rng.integers(0, 10, 6).astype(np.int64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    per_example = -(shifted[np.arange(6), labels] - np.log(np.exp(shifted).sum(axis=1)))
    assert float(mean_loss(logits, labels, 6)) == pytest.approx(per_example.mean(), rel=1e-6)
    # Two padding rows (weight 0) change nothing; a shard divides by the global count.
    weights = np.array([1, 1, 1, 1, 0, 0], np.float32)
    assert float(mean_loss(logits, labels, 4, weights)) == pytest.approx(per_example[:4].mean(), rel=1e-6)
    assert float(mean_loss(logits[:2], labels[:2], 4)) + float(mean_loss(logits[2:4], labels[2:4], 4)) == pytest.approx(
        per_example[:4].mean(), rel=1e-6
    )
    correct = (logits.argmax(axis=1) == labels).astype(np.float32)
    assert float(correct_count(logits, labels, weights)) == (correct * weights).sum()


def numpy_adam(params, grads_per_step, lr, beta_1=0.9, beta_2=0.999, eps=1e-7):
    """Textbook bias-corrected Adam in float64."""
    params = [p.astype(np.float64) for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t, grads in enumerate(grads_per_step, start=1):
        for i, g in enumerate(grads):
            m[i] = beta_1 * m[i] + (1 - beta_1) * g
            v[i] = beta_2 * v[i] + (1 - beta_2) * g * g
            m_hat, v_hat = m[i] / (1 - beta_1**t), v[i] / (1 - beta_2**t)
            params[i] = params[i] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return params


def make_adam(variables, formulation="fixed", lr=1e-3):
    return Adam(
        variables,
        lr,
        zeros_like=lambda var: tf.Variable(tf.zeros_like(var)),
        make_step=lambda: tf.Variable(0, dtype=tf.int64),
        formulation=formulation,
    )


def random_problem(steps=5):
    rng = np.random.default_rng(1)
    params = [rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)]
    grads = [[rng.standard_normal(p.shape).astype(np.float32) * 0.1 for p in params] for _ in range(steps)]
    return params, grads


def test_adam_matches_numpy_over_several_steps_in_a_tf_function():
    params, grads_per_step = random_problem()
    variables = [tf.Variable(p) for p in params]
    adam = make_adam(variables)
    apply = tf.function(lambda grads: adam.apply_gradients(grads, variables))
    for grads in grads_per_step:
        apply([tf.constant(g) for g in grads])
    expected = numpy_adam(params, grads_per_step, 1e-3)
    for var, want in zip(variables, expected):
        np.testing.assert_allclose(var.numpy(), want, rtol=0, atol=1e-6)
    assert int(adam.step.numpy()) == 5


def test_tutorial_adam_freezes_the_step_count_at_trace_time():
    params, grads_per_step = random_problem()
    variables = [tf.Variable(p) for p in params]
    adam = make_adam(variables, "tutorial")
    apply = tf.function(lambda grads: adam.apply_gradients(grads, variables))
    for grads in grads_per_step:
        apply([tf.constant(g) for g in grads])
    # The Python float advanced once, at trace time; every step used t = 1.
    assert adam.tutorial_t == 2.0
    m = [np.zeros_like(p, np.float64) for p in params]
    v = [np.zeros_like(p, np.float64) for p in params]
    frozen = [p.astype(np.float64) for p in params]
    for grads in grads_per_step:
        for i, g in enumerate(grads):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            frozen[i] -= 1e-3 * (m[i] / 0.1) / (np.sqrt(v[i] / 0.001) + 1e-7)
    for var, want in zip(variables, frozen):
        np.testing.assert_allclose(var.numpy(), want, rtol=0, atol=1e-6)
    correct = numpy_adam(params, grads_per_step, 1e-3)
    assert np.abs(variables[0].numpy() - correct[0]).max() > 1e-4


def test_sgd_matches_numpy():
    params, grads_per_step = random_problem(3)
    variables = [tf.Variable(p) for p in params]
    sgd = SGD(0.5, lambda: tf.Variable(0, dtype=tf.int64))
    for grads in grads_per_step:
        sgd.apply_gradients([tf.constant(g) for g in grads], variables)
    assert int(sgd.step) == len(grads_per_step)  # what dropout's numbers are drawn from
    for i, var in enumerate(variables):
        want = params[i].astype(np.float64) - 0.5 * sum(g[i] for g in grads_per_step)
        np.testing.assert_allclose(var.numpy(), want, rtol=0, atol=1e-6)


def test_model_forward_is_relu_mlp():
    values = initial_values((784, 16, 8, 10), 3)
    values[1] = np.full(16, 0.01, np.float32)
    model = Model(mlp((16, 8)), values)
    x = np.random.default_rng(2).random((5, 784), dtype=np.float32)
    hidden = np.maximum(x @ values[0] + values[1], 0)
    hidden = np.maximum(hidden @ values[2] + values[3], 0)
    np.testing.assert_allclose(model(x).numpy(), hidden @ values[4] + values[5], rtol=1e-5, atol=1e-6)
    assert [w.shape for w in model.weights] == [v.shape for v in values]
