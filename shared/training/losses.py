"""The one definition of the loss and of accuracy, for every trainer.

loss = (sum of per-example softmax cross-entropy over the real examples of the
global batch) / (number of real examples in the global batch).

On an unpadded batch on one device this is the tutorial's `reduce_mean`. A
distributed trainer calls it per shard with `num_real` = the *global* count, and
padding examples (weight 0) that let a partial batch divide over devices add
nothing; summing the shards' losses and gradients then gives the global mean.
"""

import tensorflow as tf


def loss_sum(logits, labels, example_weights=None):
    """Sum of per-example softmax cross-entropy; `example_weights` is 1 for real, 0 for padding."""
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    if example_weights is not None:
        per_example = per_example * tf.cast(example_weights, per_example.dtype)
    return tf.reduce_sum(per_example)


def mean_loss(logits, labels, num_real, example_weights=None):
    """The training loss: `loss_sum` divided by the global number of real examples."""
    return loss_sum(logits, labels, example_weights) / tf.cast(num_real, logits.dtype)


def correct_count(logits, labels, example_weights=None):
    """Number of real examples whose arg-max logit is the label (accuracy = this / real count)."""
    correct = tf.cast(tf.equal(tf.argmax(logits, axis=1), labels), tf.float32)
    if example_weights is not None:
        correct = correct * example_weights
    return tf.reduce_sum(correct)
