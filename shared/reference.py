"""The reference trainer: plain TensorFlow on one device, no strategy, no DTensor.

It is the ground truth that the distributed trainers are checked against: the same
model, initial values, optimizer and global batches, with nothing distributed.
    python compare.py --trainers reference --data embedded

Speed, applied alike to the distributed trainers where their API allows: an epoch is
`train_steps` calls over chunks of stacked batches (`shared.data.step_chunks`: the first
step alone, then runs of equal-size batches), each a loop in the graph with one host sync
per epoch, and the optimizer update is compiled by XLA (`shared.optim.apply_gradients_fused`).
"""
import time
from typing import Callable, List, Sequence

import tensorflow as tf

from shared.checkpoint import TrainingState
from shared.checksums import read_state_checksums, state_checksums, state_names, state_variables
from shared.config import Config
from shared.data import MnistData, batch_slices, epoch_batches, step_chunks
from shared.export import export_trainer
from shared.history import EpochMeter, History, format_epoch_line
from shared.losses import correct_count, loss_sum, mean_loss
from shared.memory import DeviceMemory, located_bytes, tally
from shared.model import build_model_and_optimizer
from shared.optim import apply_gradients_fused


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
    apply_gradients_fused(optimizer, grads, model.weights)  # the update compiled by XLA
    return loss, correct_count(logits, y)


@tf.function
def train_steps(model, optimizer, x_steps, y_steps, record_state: bool = False):
    """`train_step` on x_steps[i], y_steps[i] for every i, in one call: a loop in the graph.

    Returns [steps] tensors of the per-step losses and correct counts, the same values as
    one call per step, without a Python round trip per step, and with `record_state` the
    state checksums at the start of each step ([steps, variables]; else [0, variables]).
    """
    steps = tf.shape(y_steps)[0]
    losses = tf.TensorArray(model.weights[0].dtype, size=steps)
    corrects = tf.TensorArray(tf.float32, size=steps)
    variables = state_variables(model, optimizer)
    checksums = tf.TensorArray(tf.float64, size=steps if record_state else 0,
                               element_shape=[len(variables)])
    for i in tf.range(steps):
        if record_state:  # Python bool: decided when traced
            checksums = checksums.write(i, state_checksums(variables))
        loss, correct = train_step(model, optimizer, x_steps[i], y_steps[i])
        losses, corrects = losses.write(i, loss), corrects.write(i, correct)
    return losses.stack(), corrects.stack(), checksums.stack()


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


def memory_per_device(model, optimizer) -> List[DeviceMemory]:
    """Bytes of weights and optimizer state, from the variables themselves (all on one device)."""
    return tally(located_bytes(model.weights), located_bytes(optimizer.variables))


def fit(config: Config, data: MnistData, devices: Sequence[str], log: Callable = print) -> History:
    """Train on devices[0] and return the shared history record."""
    device = devices[0]
    history = History(trainer="reference", placement=f"1 x {device.split(':')[0]} ({device})", dtype=config.dtype)
    record_state = config.dtype == "float64"  # per-step state checksums: what parity names when it fails
    with tf.device(device):
        model, optimizer = build_model_and_optimizer(config)
        history.state_names = state_names(model, optimizer) if record_state else []
        state = TrainingState("reference", config, model, optimizer, len(data.y_train), log)
        start_epoch = state.restore()  # --restore: epochs already trained; 0 without
        first_x, first_y = next(epoch_batches(data.x_train, data.y_train, config.batch_size, start_epoch,
                                              config.shuffle, config.seed))
        history.first_step_gradients = [g.numpy() for g in compute_gradients(model, first_x, first_y)]

        for epoch in range(start_epoch, config.epochs):
            meter = EpochMeter(f"reference epoch {epoch + 1}/{config.epochs}",
                               len(batch_slices(len(data.y_train), config.batch_size)))
            batches = epoch_batches(data.x_train, data.y_train, config.batch_size, epoch, config.shuffle, config.seed)
            traces_before = train_steps.experimental_get_tracing_count()
            for chunk, (x_steps, y_steps) in enumerate(step_chunks(batches, first_alone=epoch == start_epoch)):
                started = time.perf_counter()
                if epoch == start_epoch and chunk == 0:  # one trace for every chunk length and batch size
                    train_steps.get_concrete_function(model, optimizer, tf.TensorSpec([None, None, *x_steps.shape[2:]]),
                                                      tf.TensorSpec([None, None], tf.int64), record_state)
                losses, corrects, checksums = train_steps(model, optimizer, x_steps, y_steps, record_state)
                if epoch == start_epoch and chunk == 0:
                    losses.numpy()  # host sync, once: the first call (one step) is the trace time
                    history.trace_seconds = time.perf_counter() - started
                meter.add_steps(losses, corrects, [y_steps.shape[1]] * len(y_steps),
                                checksums if record_state else None)
            finished = meter.finish()  # before evaluating: the epoch's time is training only
            traces = train_steps.experimental_get_tracing_count() - traces_before
            test_loss, test_accuracy = evaluate(model, data.x_test, data.y_test, config.batch_size)
            record = history.add_epoch(epoch + 1, meter, finished, test_loss, test_accuracy, traces)
            if not config.quiet:
                log(format_epoch_line("reference", record, config.epochs))
            state.save_epoch(epoch + 1)  # --checkpoint-dir
        if record_state:
            history.add_final_state(read_state_checksums(state_variables(model, optimizer)))
        history.final_weights = [w.numpy() for w in model.weights]
        history.memory_per_device = memory_per_device(model, optimizer)
        export_trainer(config, "reference", history.final_weights, lambda x: model(x).numpy(),  # --export
                       data.x_test, history.details)
    return history
