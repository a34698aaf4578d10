"""The reference trainer: plain TensorFlow on one device, no strategy, no DTensor: the ground truth.

    python compare.py --trainers reference --data embedded

The same model, initial values, optimizer and global batches as the distributed trainers, with
nothing distributed. For speed, as the others where their API allows: an epoch is `train_steps`
calls over stacked runs of equal-size batches (a loop in the graph, one host sync per epoch),
and the optimizer update is compiled by XLA (`shared.training.optim.apply_gradients_fused`).
"""

from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from shared.config import Config
from shared.measure import profile, traffic
from shared.measure.checksums import state_checksums, state_variables
from shared.measure.history import History
from shared.measure.memory import located_bytes, tally
from shared.measure.taps import Taps
from shared.training import loop
from shared.training.batches import epoch_batches, step_chunks
from shared.training.build import build_model_and_optimizer
from shared.training.data import Dataset
from shared.training.losses import correct_count, host_label_count, label_count, loss_sum, mean_loss
from shared.training.optim import apply_gradients_fused, dense
from shared.training.protocol import ClusterRole, RunFacts, Trainer, Variant


def training_context(model, optimizer, x, record: bool = False):
    """The forward's context in a step: every example of x is the global batch's, in order."""
    return model.training_context(optimizer.step, tf.range(tf.shape(x, out_type=tf.int64)[0]), record)


@tf.function
def compute_gradients(model, optimizer, x, y):
    with tf.GradientTape() as tape:
        loss = mean_loss(model(x, training_context(model, optimizer, x)), y, label_count(y), loss=model.definition.loss)
    return dense(tape.gradient(loss, model.trainable))


def record_taps(model, optimizer, x, y) -> Taps:
    """The forward's tapped values and their gradients at the current state (no update): the replay's."""
    names = []

    @tf.function
    def record():
        context = training_context(model, optimizer, x, record=True)
        with tf.GradientTape() as tape:
            loss = mean_loss(model(x, context), y, label_count(y), loss=model.definition.loss)
        names.extend(name for name, _ in context.taps)
        values = [value for _, value in context.taps]
        return values, tape.gradient(loss, values)

    values, gradients = record()
    return Taps(names, [v.numpy() for v in values], [None if g is None else g.numpy() for g in gradients])


@tf.function
def train_step(model, optimizer, x, y):
    """One optimizer step on a global batch; returns (mean loss, correct count) before the update."""
    context = training_context(model, optimizer, x)
    with tf.GradientTape() as tape:
        with tf.name_scope(profile.FORWARD_SCOPE):  # the scopes name the step's parts for --profile
            logits = model(x, context)
            loss = mean_loss(logits, y, label_count(y), loss=model.definition.loss)
    grads = dense(tape.gradient(loss, model.trainable))
    with tf.name_scope(profile.UPDATE_SCOPE):
        model.apply_updates(context)  # running statistics, from the batch the forward saw
        apply_gradients_fused(optimizer, grads, model.trainable)  # the update compiled by XLA
    return loss, correct_count(logits, y)


@tf.function
def train_steps(model, optimizer, x_steps, y_steps, record_state: bool = False):
    """`train_step` on x_steps[i], y_steps[i] for every i, in one call: a loop in the graph.

    Returns [steps] tensors of the per-step losses and correct counts, and with `record_state` the
    state checksums at the start of each step ([steps, variables]; else [0, variables]).
    """
    steps = tf.shape(y_steps)[0]
    losses = tf.TensorArray(model.weights[0].dtype, size=steps)
    corrects = tf.TensorArray(tf.float32, size=steps)
    variables = state_variables(model, optimizer)
    checksums = tf.TensorArray(tf.float64, size=steps if record_state else 0, element_shape=[len(variables)])
    for i in tf.range(steps):
        if record_state:  # Python bool: decided when traced
            checksums = checksums.write(i, state_checksums(variables))
        with tf.name_scope(profile.INPUT_SCOPE):
            x, y = x_steps[i], y_steps[i]
        loss, correct = train_step(model, optimizer, x, y)
        losses, corrects = losses.write(i, loss), corrects.write(i, correct)
    return losses.stack(), corrects.stack(), checksums.stack()


@tf.function
def test_step(model, x, y):
    logits = model(x)
    return loss_sum(logits, y, loss=model.definition.loss), correct_count(logits, y)


def memory_per_device(model, optimizer):
    """Bytes of weights and optimizer state, from the variables themselves (all on one device)."""
    return tally(located_bytes(model.weights), located_bytes(optimizer.variables))


class ReferenceTrainer(Trainer):
    """The parts shared.training.loop.fit calls, on one device."""

    name = "reference"

    def __init__(self, config: Config, data: Dataset, device: str):
        self.config, self.data, self.device = config, data, device
        self.placement = f"1 x {device.split(':')[0]} ({device})"
        self.details = {}
        self.collectives = traffic.ONE_DEVICE
        self.model, self.optimizer = build_model_and_optimizer(config)
        self.checkpointed = (self.model, self.optimizer)

    def gradients(self, x, y):
        return [g.numpy() for g in compute_gradients(self.model, self.optimizer, x, y)]

    def taps(self, x, y) -> Taps:
        return record_taps(self.model, self.optimizer, x, y)

    def train_epoch(self, epoch: int, meter, first: bool, record_state: bool):
        batches = epoch_batches(
            self.data.x_train, self.data.y_train, self.config.batch_size, epoch, self.config.shuffle, self.config.seed
        )
        for x_steps, y_steps in step_chunks(batches, first_alone=first):
            if first:  # one trace for every chunk length and batch size
                train_steps.get_concrete_function(
                    self.model,
                    self.optimizer,
                    tf.TensorSpec([None, None, *x_steps.shape[2:]], x_steps.dtype),
                    tf.TensorSpec([None, None, *y_steps.shape[2:]], y_steps.dtype),
                    record_state,
                )
            losses, corrects, checksums = train_steps(self.model, self.optimizer, x_steps, y_steps, record_state)
            if first:
                losses.numpy()  # host sync, once: the first call (one step) is the trace time
                first = False
            meter.add_steps(
                losses, corrects, [host_label_count(y) for y in y_steps], checksums if record_state else None
            )

    def trace_count(self) -> int:
        return train_steps.experimental_get_tracing_count()

    def step_call(self) -> profile.StepCall:
        """--profile: a measured epoch's first call, the stacked run of its equal-size batches."""

        def prepare():
            batches = epoch_batches(self.data.x_train, self.data.y_train, self.config.batch_size)
            return tuple(tf.constant(array) for array in next(step_chunks(batches)))

        def run(inputs):
            train_steps(self.model, self.optimizer, *inputs)[0].numpy()  # host sync: the call has run

        return profile.StepCall(len(prepare()[1]), prepare, run, lambda: (traffic.one_device(self.device), ""))

    def evaluate(self, x, y):
        """(mean loss, accuracy) over a whole split, in batches."""
        total_loss, total_correct = 0.0, 0.0
        for x_batch, y_batch in epoch_batches(x, y, self.config.batch_size):
            batch_loss, batch_correct = test_step(self.model, x_batch, y_batch)
            total_loss, total_correct = total_loss + batch_loss, total_correct + batch_correct
        return float(total_loss) / host_label_count(y), float(total_correct) / host_label_count(y)

    def state(self):
        return state_variables(self.model, self.optimizer)

    def final_weights(self):
        return [w.numpy() for w in self.model.weights]

    def memory_per_device(self):
        return memory_per_device(self.model, self.optimizer)

    def predict_logits(self, x):
        return self.model(x).numpy()


def fit(config: Config, data: Dataset, devices: Sequence[str], log: Callable = print) -> History:
    """Train on devices[0] and return the shared history record."""
    with tf.device(devices[0]):
        return loop.fit(ReferenceTrainer(config, data, devices[0]), config, data, log)


# The rest of shared.training.protocol.TrainerModule: one device has no mesh, no variants and no cluster.


def check_config(config: Config, devices: Sequence[str]) -> None:
    """Nothing to check: any device runs it."""


def before_runtime(config: Config, device_count: int) -> None:
    """Nothing to fix before TensorFlow starts."""


def process_environment(config: Config) -> Dict[str, str]:
    return {}  # it trains in the run's own process, with TensorFlow's default threads: one device uses them all


def describe_run(config: Config) -> RunFacts:
    return RunFacts()


def variants(config: Config, count: int, every_layout: bool, meshes: Sequence[str] = ()) -> List[Variant]:
    return []  # the reference trains beside every configuration instead


def cluster_variables() -> Tuple[str, ...]:
    return ()


def cluster_role(config: Config, environ: Mapping[str, str]) -> Optional[ClusterRole]:
    return None  # with --clients, the launcher (or client 0) trains it in its own process


def client_environment(client_id: int, addresses: Sequence[str]) -> Dict[str, str]:
    return {}


def join_cluster(config: Config) -> None:
    """Nothing: it never joins a cluster."""
