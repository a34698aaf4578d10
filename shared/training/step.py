"""The step's arithmetic, written once for every trainer: the loss and its gradients, the taps and their
gradients, a test batch's sums, the evaluation over a split and the memory tally. A trainer says only where
the tensors live and how the gradients are combined (the loss divides by the global count: losses.py)."""

from typing import Callable, List, Tuple

import numpy as np
import tensorflow as tf

from dtensor_vs_mirrored.shared.measure import profile
from dtensor_vs_mirrored.shared.measure.checksums import state_checksums
from dtensor_vs_mirrored.shared.measure.memory import DeviceMemory, located_bytes, tally
from dtensor_vs_mirrored.shared.measure.taps import Taps
from dtensor_vs_mirrored.shared.model.forward import ForwardContext
from dtensor_vs_mirrored.shared.training.loss_scale import scaled, unscaled
from dtensor_vs_mirrored.shared.training.losses import (
    correct_count,
    label_count,
    loss_sum,
    mean_loss,
    with_model_losses,
)
from dtensor_vs_mirrored.shared.training.optim import dense


def loss_and_gradients(model, x, y, count, context: ForwardContext, example_weights=None, piece: bool = False):
    """In a traced function: (logits, the loss of x, y over the global `count` of counted labels, its gradients
    for model.trainable, dense). `piece`: x, y are one piece of the global batch (a MirroredStrategy replica's),
    whose loss and gradients are that piece's share."""
    with tf.GradientTape() as tape:
        with tf.name_scope(profile.FORWARD_SCOPE):  # the scopes name the step's parts for --profile
            logits = model(x, context)
            loss = training_loss(model, logits, y, count, context, example_weights, piece)
            backward_from = scaled(loss, context.loss_scale)  # mixed_float16: loss_scale.py
    return logits, loss, unscaled(dense(tape.gradient(backward_from, model.trainable)), context.loss_scale)


def training_loss(model, logits, y, count, context: ForwardContext, example_weights=None, piece: bool = False):
    """The one objective every trainer differentiates: the mean of the model's per-label loss over the global
    `count`, plus the model's own losses (`context.add_loss`) once per global step: a piece adds its share of them,
    its counted labels / the global count."""
    loss = mean_loss(logits, y, count, example_weights, model.definition.loss)
    share = None
    if piece and context.losses:  # in the loss's dtype: float32's rounding of the shares would move a float64 sum
        share = tf.cast(label_count(y, example_weights), loss.dtype) / tf.cast(count, loss.dtype)
    return with_model_losses(loss, context.losses, share)


def correct(model, logits, y, example_weights=None):
    """The step's correct count (shared/training/losses.py correct_count) for the model's targets."""
    return correct_count(logits, y, example_weights, model.definition)


def tapped_gradients(model, x, y, count, context: ForwardContext, example_weights=None, piece: bool = False):
    """In a traced function, `context` recording: (tap names, tapped values, the loss's gradient of each, None
    where none flows), the values in forward order."""
    with tf.GradientTape() as tape:
        loss = training_loss(model, model(x, context), y, count, context, example_weights, piece)
    names = [name for name, _ in context.taps]
    values = [value for _, value in context.taps]
    return names, values, tape.gradient(loss, values)


def record_taps(
    model, x, y, make_context: Callable, to_host: Callable, example_weights=None, traced: Callable = tf.function
) -> Taps:
    """The forward's tapped values and their gradients on the whole global batch x, y at the current state (no
    update), each to a host array by `to_host`: the reference's and DTensor's (MirroredStrategy joins its
    replicas' `tapped_gradients`). `make_context()`: the trainer's recording training context; `traced`: how the
    trainer traces a step (DTensor: dtensor_impl.captures.on_mesh)."""
    names: List[str] = []

    def record():
        found, values, gradients = tapped_gradients(
            model, x, y, label_count(y, example_weights), make_context(), example_weights
        )
        names.extend(found)
        return values, gradients

    values, gradients = traced(record)()
    return host_taps(names, values, gradients, to_host)


def host_taps(names: List[str], values: list, gradients: list, to_host: Callable) -> Taps:
    """Taps from what a traced `tapped_gradients` returned, each value and gradient to a host array."""
    return Taps(
        list(names), [to_host(value) for value in values], [None if g is None else to_host(g) for g in gradients]
    )


def loop_steps(steps, loss_dtype, variables, record_state: bool, one_step: Callable, first_gradients=None):
    """In a traced function: `one_step(i)` -> (mean loss, correct count) for i in 0..steps-1, a loop in the graph;
    returns [steps] tensors of the losses and correct counts, and with `record_state` (a Python bool: decided when
    traced) the checksums of `variables` at the start of each step ([steps, variables]; else [0, variables]).
    With `first_gradients` (zeros of each gradient's shape), `one_step(i)` -> (loss, correct, gradients) and a
    fourth result: step 0's gradients, carried out of the loop (the call of one step gives its gradients and
    later calls, of any length, run the same trace)."""
    losses = tf.TensorArray(loss_dtype, size=steps)
    corrects = tf.TensorArray(tf.float32, size=steps)
    checksums = tf.TensorArray(tf.float64, size=steps if record_state else 0, element_shape=[len(variables)])
    first = list(first_gradients or [])
    for i in tf.range(steps):
        if record_state:
            checksums = checksums.write(i, state_checksums(variables))
        loss, correct, *gradients = one_step(i)
        if first_gradients is not None:
            first = tf.cond(i == 0, lambda new=gradients[0]: shaped_like(new, first_gradients), lambda kept=first: kept)
        losses, corrects = losses.write(i, loss), corrects.write(i, correct)
    stacked = losses.stack(), corrects.stack(), checksums.stack()
    return stacked if first_gradients is None else (*stacked, first)


def shaped_like(gradients, zeros) -> list:
    """Each gradient with its weight's static shape, as `zeros` has it: a replica's may have lost it (a Dense on 3
    axes: (None, 8) for a (28, 8) kernel), and the loop that carries them out needs the shape it started with."""
    return [tf.ensure_shape(gradient, like.shape) for gradient, like in zip(gradients, zeros)]


def test_sums(model, x, y, example_weights=None):
    """(summed loss, correct count) of a test batch, at the current weights, in inference."""
    logits = model(x)
    return loss_sum(logits, y, example_weights, model.definition.loss), correct(model, logits, y, example_weights)


def evaluate(trainer, x: np.ndarray, y: np.ndarray, counted_labels: int) -> Tuple[float, float]:
    """(mean loss, accuracy) over the split x, y: the trainer's test step on each of its batches, summed on the
    host (one sync at the end) and divided by the split's `counted_labels`."""
    results = [trainer.test_step(batch) for batch in trainer.test_batches(x, y)]
    total_loss = sum(float(batch_loss) for batch_loss, _ in results)  # host sync point
    total_correct = sum(float(batch_correct) for _, batch_correct in results)
    return total_loss / counted_labels, total_correct / counted_labels


def memory_per_device(trainer) -> List[DeviceMemory]:
    """Bytes of weights and optimizer state on each device, from the trainer's live variables' per-device values
    (padding included: it is held)."""
    weights, optimizer_state = trainer.held_variables()
    return tally(located_bytes(trainer.per_device(weights)), located_bytes(trainer.per_device(optimizer_state)))
