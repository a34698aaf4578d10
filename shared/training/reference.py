"""The reference trainer: plain TensorFlow on one device, no strategy, no DTensor: the ground truth.

    python compare.py --trainers reference --data embedded

The same model, initial values, optimizer and global batches as the distributed trainers, with nothing
distributed. For speed, as the others where their API allows: an epoch is `train_steps` calls over stacked
runs of equal-size batches (a loop in the graph, one host sync per epoch), and the optimizer update is
compiled by XLA (`shared.training.optim.apply_gradients_fused`).
"""

import itertools

import tensorflow as tf

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.devices import one_intra_op_thread
from dtensor_vs_mirrored.shared.measure import profile, traffic
from dtensor_vs_mirrored.shared.measure.checksums import state_variables
from dtensor_vs_mirrored.shared.measure.taps import Taps
from dtensor_vs_mirrored.shared.training import batch_inputs, step
from dtensor_vs_mirrored.shared.training.batches import epoch_batches, step_chunks
from dtensor_vs_mirrored.shared.training.build import build_model_and_optimizer
from dtensor_vs_mirrored.shared.training.data import Dataset
from dtensor_vs_mirrored.shared.training.keras_fit import KerasFitTrainer
from dtensor_vs_mirrored.shared.training.loss_scale import loss_scale_of
from dtensor_vs_mirrored.shared.training.losses import host_label_count, label_count
from dtensor_vs_mirrored.shared.training.optim import apply_gradients_fused
from dtensor_vs_mirrored.shared.training.protocol import Trainer, TrainerSpec


def training_context(model, optimizer, x, record: bool = False):
    """The forward's context in a step: every example of x is the global batch's, in order."""
    positions = tf.range(tf.shape(batch_inputs.first(x), out_type=tf.int64)[0])
    return model.training_context(optimizer.step, positions, record, loss_scale_of(optimizer))


@tf.function
def compute_gradients(model, optimizer, x, y):
    return step.loss_and_gradients(model, x, y, label_count(y), training_context(model, optimizer, x))[2]


@tf.function
def train_step(model, optimizer, x, y):
    """One optimizer step on a global batch; returns (mean loss, correct count) before the update."""
    context = training_context(model, optimizer, x)
    logits, loss, grads = step.loss_and_gradients(model, x, y, label_count(y), context)
    with tf.name_scope(profile.UPDATE_SCOPE):
        model.apply_updates(context)  # running statistics, from the batch the forward saw
        apply_gradients_fused(optimizer, grads, model.trainable)  # the update compiled by XLA
    return loss, step.correct(model, logits, y)


@tf.function
def train_steps(model, optimizer, x_steps, y_steps, record_state: bool = False):
    """`train_step` on x_steps[i], y_steps[i] for every i, in one call: a loop in the graph (step.loop_steps)."""

    def one_step(i):
        with tf.name_scope(profile.INPUT_SCOPE):
            x, y = batch_inputs.take(x_steps, i), y_steps[i]
        return train_step(model, optimizer, x, y)

    variables = state_variables(model, optimizer)
    return step.loop_steps(tf.shape(y_steps)[0], model.weights[0].dtype, variables, record_state, one_step)


test_step = tf.function(step.test_sums)


class ReferenceTrainer(Trainer):
    """The parts shared.training.loop.fit calls, on one device."""

    name = "reference"

    def __init__(self, config: Config, data: Dataset, devices, log=print):
        self.config, self.data, self.device = config, data, devices[0]
        self.placement = f"1 x {self.device.split(':')[0]} ({self.device})"
        self.details = {}
        self.collectives = traffic.ONE_DEVICE
        self.model, self.optimizer = build_model_and_optimizer(config)
        self.checkpointed = (self.model, self.optimizer)

    def gradients(self, x, y):
        return [g.numpy() for g in compute_gradients(self.model, self.optimizer, x, y)]

    def taps(self, x, y) -> Taps:
        make_context = lambda: training_context(self.model, self.optimizer, x, record=True)  # noqa: E731
        return step.record_taps(self.model, x, y, make_context, lambda value: value.numpy())

    def step(self, x, y):
        train_step(self.model, self.optimizer, x, y)

    def train_epoch(self, epoch: int, meter, first: bool, record_state: bool):
        batches = epoch_batches(
            self.data.x_train, self.data.y_train, self.config.batch_size, epoch, self.config.shuffle, self.config.seed
        )
        for x_steps, y_steps in step_chunks(batches, first_alone=first):
            if first:
                self.trace_any_length(x_steps, y_steps, record_state)
            losses, corrects, checksums = train_steps(self.model, self.optimizer, x_steps, y_steps, record_state)
            if first:
                losses.numpy()  # host sync, once: the first call (one step) is the trace time
                first = False
            meter.add_steps(
                losses, corrects, [host_label_count(y) for y in y_steps], checksums if record_state else None
            )

    def trace_any_length(self, x_steps, y_steps, record_state: bool = False) -> None:
        """One trace of train_steps for every chunk length and batch size: a call of other shapes runs it too."""
        train_steps.get_concrete_function(
            self.model,
            self.optimizer,
            batch_inputs.each(lambda x: tf.TensorSpec([None, None, *x.shape[2:]], x.dtype), x_steps),
            tf.TensorSpec([None, None, *y_steps.shape[2:]], y_steps.dtype),
            record_state,
        )

    def trace_count(self) -> int:
        return train_steps.experimental_get_tracing_count()

    def step_call(self, most_steps: int = 0) -> profile.StepCall:
        """A measured epoch's first call, the stacked run of its equal-size batches (its first `most_steps`: the
        trace takes any count)."""

        def prepare():
            batches = epoch_batches(self.data.x_train, self.data.y_train, self.config.batch_size)
            first = itertools.islice(batches, most_steps or None)  # only the batches the call runs
            return tuple(batch_inputs.each(tf.constant, array) for array in next(step_chunks(first)))

        def run(inputs):
            train_steps(self.model, self.optimizer, *inputs)[0].numpy()  # host sync: the call has run

        inputs = prepare()
        self.trace_any_length(*inputs)  # the trace training runs (a reference kept untrained runs no epoch)
        steps, batch = inputs[1].shape[:2]
        return profile.StepCall(steps, prepare, run, examples=steps * batch)

    def test_batches(self, x, y):
        return epoch_batches(x, y, self.config.batch_size)

    def test_step(self, batch):
        return test_step(self.model, *batch)

    def state(self):
        return state_variables(self.model, self.optimizer)

    def final_weights(self):
        return [w.numpy() for w in self.model.weights]

    def predict_logits(self, x):
        return self.model(x).numpy()


SPEC = TrainerSpec(
    "reference",
    ReferenceTrainer,
    count_bytes=lambda trainer: (traffic.one_device(trainer.device), ""),
    scope=lambda devices: tf.device(devices[0]),  # on its process's first device
    # Its runs' process (shared.run.lanes.reference_apart): one intra-op thread on CPUs, as each distributed device's
    process_environment=one_intra_op_thread,
    distributes=False,
    fit_trainer=KerasFitTrainer,  # model.fit on one device
)
