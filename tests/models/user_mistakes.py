"""Small MLPs with the mistakes users make, for tests/test_user_models.py: `--model tests/models/user_mistakes.py:NAME`.

Each is the two-layer MLP below with one change: a loss that averages over the examples it sees (the
per-replica scaling of tensorflow/tensorflow#55321), a variable the forward never uses, a forward that
fails on the input spec, and `w[None]` on a weight (on a DTensor it kills the process: docs/models.md).
"""

import tensorflow as tf

from dtensor_vs_mirrored.shared.model.definition import ModelDefinition, Variable, truncated_normal, zeros

HIDDEN = 32


def forward(v, images):
    hidden = tf.nn.relu(tf.matmul(images, v["w1"]) + v["b1"])
    return tf.matmul(hidden, v["w2"]) + v["b2"]


def small_mlp(**changes) -> ModelDefinition:
    variables = (
        Variable("w1", (784, HIDDEN), truncated_normal(0.05, 1)),
        Variable("b1", (HIDDEN,), zeros),
        Variable("w2", (HIDDEN, 10), truncated_normal(0.1, 2)),
        Variable("b2", (10,), zeros),
    )
    fields = dict(name="small mlp", variables=variables, forward=forward, flops_per_example=6 * 784 * HIDDEN)
    return ModelDefinition(**{**fields, **changes})


def mean_over_local_batch(logits, labels):
    """Wrong: each label's loss divided by the examples this device sees, so the trainers' division by the
    global count divides twice; one device sees them all, a replica 1/R of them."""
    per_label = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return per_label / tf.cast(tf.shape(labels)[0], per_label.dtype)


def local_mean_loss() -> ModelDefinition:
    return small_mlp(loss=mean_over_local_batch)


def leftover_variable() -> ModelDefinition:
    base = small_mlp()
    return small_mlp(variables=base.variables + (Variable("unused", (3,), zeros),))


def wrong_input_shape() -> ModelDefinition:
    return small_mlp(forward=lambda v, images: forward(v, tf.reshape(images, [-1, 28, 28])))


def newaxis_forward(v, images):
    """`[None]` on a replicated weight, as a position embedding's `wpe[None]` (../shared/repro: SIGSEGV)."""
    return forward({**v, "w1": v["w1"][None][0]}, images)


def newaxis() -> ModelDefinition:
    return small_mlp(forward=newaxis_forward)
