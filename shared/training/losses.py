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
Float labels (binary or values targets) all count, one loss an example; the model's own losses add once a step.
"""

import numpy as np
import tensorflow as tf


def cross_entropy(logits, labels):
    """Softmax cross-entropy of every label: logits [..., classes], labels [...] -> [...]."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def mean_squared_error(outputs, targets):
    """The default loss of float targets: the squared error averaged over the output's last axis -> [N, ...]."""
    return tf.reduce_mean(tf.square(outputs - tf.cast(targets, outputs.dtype)), axis=-1)


def counted(labels, example_weights=None):
    """1.0 where a label counts, 0.0 elsewhere, shaped as `labels` (float targets: as their loss, without the
    last axis)."""
    if tf.as_dtype(labels.dtype).is_floating:
        mask = tf.ones_like(labels[..., 0], tf.float32)
    else:
        mask = tf.cast(labels >= 0, tf.float32)
    if example_weights is not None:  # [N]: one weight an example, broadcast over its labels
        weights = tf.cast(example_weights, tf.float32)
        for _ in range(len(mask.shape) - 1):
            weights = tf.expand_dims(weights, -1)  # not [..., None]: on a DTensor it kills the process
        mask = mask * weights
    return mask


def label_count(labels, example_weights=None):
    """How many labels count (a float32 scalar): the divisor of the global mean."""
    return tf.reduce_sum(counted(labels, example_weights))


def loss_sum(logits, labels, example_weights=None, loss=None):
    """Sum of the per-label loss over the counted labels; `loss` is the model's (None: cross-entropy)."""
    mask = counted(labels, example_weights)
    if tf.as_dtype(labels.dtype).is_floating:
        per_label = (loss or mean_squared_error)(logits, labels)
    else:
        per_label = (loss or cross_entropy)(logits, tf.where(labels >= 0, labels, tf.zeros_like(labels)))
    return tf.reduce_sum(per_label * tf.cast(mask, per_label.dtype))


def mean_loss(logits, labels, count, example_weights=None, loss=None):
    """The training loss: `loss_sum` divided by the global number of counted labels."""
    return loss_sum(logits, labels, example_weights, loss) / tf.cast(count, logits.dtype)


def with_model_losses(loss, model_losses, share=None):
    """The step's loss with the model's own losses added (a list of scalars; none: `loss` as it is). `share`: the
    part of the global batch this piece holds (a MirroredStrategy replica's count / the global count), by which
    each piece weighs them, so that the pieces' sum adds them once; None: the piece is the whole global batch."""
    if not model_losses:
        return loss
    total = tf.add_n([tf.cast(value, loss.dtype) for value in model_losses])
    return loss + (total if share is None else total * tf.cast(share, loss.dtype))


def correct_count(logits, labels, example_weights=None, definition=None):
    """Number of counted labels predicted right (accuracy = this / the count): the arg-max logit is the class;
    binary targets (a `definition`'s): the output is above its threshold where the label is 1, the units of an
    example averaged; float "values" targets: 0 (a regression has no accuracy)."""
    targets = "classes" if definition is None else definition.targets
    if targets == "values":
        return tf.reduce_sum(counted(labels, example_weights)) * 0.0
    if targets == "binary":
        predicted = tf.cast(logits, tf.float64) > definition.binary_threshold
        right = tf.cast(tf.equal(predicted, tf.cast(labels, tf.float64) > 0.5), tf.float32)
        correct = tf.reduce_mean(right, axis=-1)
    else:
        correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1), tf.cast(labels, tf.int64)), tf.float32)
    return tf.reduce_sum(correct * counted(labels, example_weights))


def host_label_count(labels) -> int:
    """`label_count` of a host batch without padding: the count the loop records for accuracy."""
    if labels.dtype.kind == "f":  # float targets: one an example and position
        return int(np.prod(labels.shape[:-1]))
    return int((labels >= 0).sum())
