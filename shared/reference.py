"""The reference trainer: plain TensorFlow on one device, no strategy, no DTensor.

It is the ground truth that the distributed trainers are checked against: the same
model, initial values, optimizer and global batches, with nothing distributed.
    python compare.py --trainers reference --data embedded
"""
import time
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from shared.config import Config
from shared.data import MnistData, batch_slices, epoch_batches
from shared.history import EpochMeter, EpochRecord, History, format_epoch_line
from shared.losses import correct_count, loss_sum, mean_loss
from shared.model import build_mlp, initial_values, layer_sizes
from shared.optim import make_optimizer


@tf.function
def compute_gradients(model, x, y):
    with tf.GradientTape() as tape:
        loss = mean_loss(model(x), y, tf.shape(y)[0])
    return tape.gradient(loss, model.weights)


@tf.function
def train_step(model, optimizer, x, y):
    """One optimizer step on a global batch; returns (mean loss, correct count) before the update."""
    with tf.GradientTape() as tape:
        logits = model(x)
        loss = mean_loss(logits, y, tf.shape(y)[0])
    grads = tape.gradient(loss, model.weights)
    optimizer.apply_gradients(grads, model.weights)
    return loss, correct_count(logits, y)


@tf.function
def test_step(model, x, y):
    logits = model(x)
    return loss_sum(logits, y), correct_count(logits, y)


def evaluate(model, x, y, batch_size: int):
    """(mean loss, accuracy) over a whole split, in batches."""
    total_loss, total_correct = 0.0, 0.0
    for x_batch, y_batch in epoch_batches(x, y, batch_size):
        batch_loss, batch_correct = test_step(model, x_batch, y_batch)
        total_loss, total_correct = total_loss + batch_loss, total_correct + batch_correct
    return float(total_loss) / len(y), float(total_correct) / len(y)


def fit(config: Config, data: MnistData, devices: Sequence[str], log: Callable = print) -> History:
    """Train on devices[0] and return the shared history record."""
    device = devices[0]
    history = History(trainer="reference", placement=f"1 x {device.split(':')[0]} ({device})")
    values = initial_values(layer_sizes(config.hidden), config.seed)
    with tf.device(device):
        model = build_mlp(values)
        optimizer = make_optimizer(
            config.optimizer, config.adam, model.weights, config.learning_rate,
            zeros_like=lambda var: tf.Variable(tf.zeros_like(var)),
            make_step=lambda: tf.Variable(0, dtype=tf.int64))
        first_x, first_y = next(epoch_batches(data.x_train, data.y_train, config.batch_size, 0,
                                              config.shuffle, config.seed))
        history.first_step_gradients = [g.numpy() for g in compute_gradients(model, first_x, first_y)]

        for epoch in range(config.epochs):
            meter = EpochMeter(f"reference epoch {epoch + 1}/{config.epochs}",
                               len(batch_slices(len(data.y_train), config.batch_size)))
            for step, (x_batch, y_batch) in enumerate(epoch_batches(
                    data.x_train, data.y_train, config.batch_size, epoch, config.shuffle, config.seed)):
                started = time.perf_counter()
                loss, correct = train_step(model, optimizer, x_batch, y_batch)
                if epoch == 0 and step == 0:
                    float(loss)  # host sync, once: the first call's time is the trace time
                    history.trace_seconds = time.perf_counter() - started
                meter.add(loss, correct, len(y_batch))
            step_losses, train_loss, train_accuracy, seconds = meter.finish()
            test_loss, test_accuracy = evaluate(model, data.x_test, data.y_test, config.batch_size)
            history.step_losses += step_losses
            history.step_times_ms += meter.step_times_ms
            record = EpochRecord(epoch + 1, train_loss, train_accuracy, test_loss, test_accuracy, seconds)
            history.epochs.append(record)
            if not config.quiet:
                log(format_epoch_line("reference", record, config.epochs))
        history.final_weights = [w.numpy() for w in model.weights]
    return history
