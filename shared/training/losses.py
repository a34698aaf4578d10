"""The one definition of the loss and of accuracy, for every trainer.

loss = (sum of the per-label loss over the counted labels of the global batch)
       / (number of counted labels in the global batch)

A label counts when it is 0 or more (a language model masks a position with -1) and its
example is real (a padding example, weight 0, counts nothing). The per-label loss is the
model's (ModelDefinition.loss), softmax cross-entropy by default: with one label per example
on an unpadded batch on one device this is the tutorial's `reduce_mean`. A distributed trainer
calls it per shard with `count` = the *global* count of counted labels, so summing the shards'
losses and gradients gives the global mean, whatever each shard holds: no trainer divides by
its own shard's size (the mistake of tensorflow/tensorflow#55321, docs/models.md).
"""

import tensorflow as tf


def cross_entropy(logits, labels):
    """Softmax cross-entropy of every label: logits [..., classes], labels [...] -> [...]."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def counted(labels, example_weights=None):
    """1.0 where a label counts, 0.0 elsewhere, shaped as `labels`."""
    mask = tf.cast(labels >= 0, tf.float32)
    if example_weights is not None:  # [N]: one weight an example, broadcast over its labels
        weights = tf.cast(example_weights, tf.float32)
        for _ in range(len(labels.shape) - 1):
            weights = tf.expand_dims(weights, -1)  # not [..., None]: on a DTensor it kills the process
        mask = mask * weights
    return mask


def label_count(labels, example_weights=None):
    """How many labels count (a float32 scalar): the divisor of the global mean."""
    return tf.reduce_sum(counted(labels, example_weights))


def loss_sum(logits, labels, example_weights=None, loss=None):
    """Sum of the per-label loss over the counted labels; `loss` is the model's (None: cross-entropy)."""
    mask = counted(labels, example_weights)
    per_label = (loss or cross_entropy)(logits, tf.where(labels >= 0, labels, tf.zeros_like(labels)))
    return tf.reduce_sum(per_label * tf.cast(mask, per_label.dtype))


def mean_loss(logits, labels, count, example_weights=None, loss=None):
    """The training loss: `loss_sum` divided by the global number of counted labels."""
    return loss_sum(logits, labels, example_weights, loss) / tf.cast(count, logits.dtype)


def correct_count(logits, labels, example_weights=None):
    """Number of counted labels whose arg-max logit is the label (accuracy = this / the count)."""
    correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1), tf.cast(labels, tf.int64)), tf.float32)
    return tf.reduce_sum(correct * counted(labels, example_weights))


def host_label_count(labels) -> int:
    """`label_count` of a host batch without padding: the count the loop records for accuracy."""
    return int((labels >= 0).sum())
