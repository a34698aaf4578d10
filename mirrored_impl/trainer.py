"""The MirroredStrategy trainer: the reference's training run, data-parallel under tf.distribute.

    python compare.py --trainers reference,mirrored --data embedded

Like TensorFlow's "Custom training with tf.distribute.Strategy": `MirroredStrategy` over exactly the given
devices, the model's variables as MirroredVariables, each global batch cut into contiguous per-replica pieces
(inputs.py), each replica's loss divided by the global batch's real count, and the update either once on the
first device (`--mirrored-update primary`) or on every replica after an all-reduce (`replicas`; the only mode
across workers). With `--clients C` it is MultiWorkerMirroredStrategy (cluster.py). docs/trainers.md.
"""

from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from dtensor_vs_mirrored.mirrored_impl.cluster import multi_worker_strategy
from dtensor_vs_mirrored.mirrored_impl.collectives import choose_cross_device_ops, implementation
from dtensor_vs_mirrored.mirrored_impl.inputs import (
    describe_pieces,
    distribute_batches,
    distribute_pieces,
    piece,
    replica_values,
)
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.measure import profile
from dtensor_vs_mirrored.shared.measure.checksums import state_variables
from dtensor_vs_mirrored.shared.measure.history import History
from dtensor_vs_mirrored.shared.measure.taps import Taps
from dtensor_vs_mirrored.shared.measure.traffic import Implementation
from dtensor_vs_mirrored.shared.model.definition import Model
from dtensor_vs_mirrored.shared.training import batch_inputs, step
from dtensor_vs_mirrored.shared.training.batches import batch_label_counts, epoch_batches
from dtensor_vs_mirrored.shared.training.build import build_model_and_optimizer
from dtensor_vs_mirrored.shared.training.data import Dataset
from dtensor_vs_mirrored.shared.training.loss_scale import loss_scale_of
from dtensor_vs_mirrored.shared.training.optim import apply_gradients_fused
from dtensor_vs_mirrored.shared.training.protocol import Trainer

SUM = tf.distribute.ReduceOp.SUM
UPDATE_MODES = ("primary", "replicas")  # --mirrored-update, besides auto; see train_step


def update_mode(config: Config) -> str:
    """--mirrored-update: "primary" or "replicas"; auto is primary in one process, replicas with --clients
    (across workers no device could sum every worker's gradients cheaply: each updates its own copy)."""
    if config.mirrored_update == "auto":
        return "replicas" if config.clients > 1 else "primary"
    return config.mirrored_update


# --- the steps ------------------------------------------------------------------------------


def training_context(model, optimizer, x, start, record: bool = False):
    """The forward's context on a replica: its examples sit at start.. in the global batch."""
    positions = start + tf.range(tf.shape(batch_inputs.first(x), out_type=tf.int64)[0])
    return model.training_context(optimizer.step, positions, record, loss_scale_of(optimizer))


def all_reduced(grads):
    """In replica context: every replica gets the sum of all replicas' gradients (ReductionToOneDevice on CPU:
    sum on one device, copy back to each; collectives.py). A merge_call to batch_reduce_to, as
    ReplicaContext.all_reduce makes for IndexedSlices, not all_reduce itself: its custom_gradient (the all-reduce's
    own gradient, which no step takes) walks the step's graph back from each replica's sums, lengthening every
    trace. all_reduce itself where the strategy makes no merge_call (XLA on GPUs)."""

    def reduce(strategy, *values):
        destinations = [value.device if isinstance(value, tf.Tensor) else value for value in values]
        return strategy.extended.batch_reduce_to(SUM, list(zip(values, destinations)))

    context = tf.distribute.get_replica_context()
    with tf.name_scope(profile.COLLECTIVES_SCOPE):
        if not getattr(context.strategy.extended, "_use_merge_call", lambda: True)():
            return context.all_reduce(SUM, grads)
        return list(context.merge_call(reduce, args=tuple(grads)))


@tf.function
def global_gradients(strategy, model, optimizer, pieces):
    """The gradients of the global mean loss at the current weights, as every replica sees them."""

    def on_replica(x, y, global_count, start):
        context = training_context(model, optimizer, x, start)
        return all_reduced(step.loss_and_gradients(model, x, y, global_count, context, piece=True)[2])

    return strategy.run(on_replica, args=pieces)


@tf.function
def train_step(strategy, model, optimizer, chunk, step_index=None, primary_model=None):
    """One optimizer step on global batch `step_index` of the epoch's `chunk` (None: `chunk` is a host batch's
    replica_values); returns (mean loss, correct count, the summed gradients) before the update, the gradients
    as the update took them (per replica with "replicas", on the first device with "primary").

    primary_model None ("replicas", the tf.distribute tutorial's pattern): the gradients are all-reduced and
    every replica applies the optimizer to its own copies. Otherwise ("primary"): the gradients are summed on
    the first device only, the optimizer updates `primary_model` there once, and its weights are copied to
    every replica's copy. Every epoch's chunk has the same shapes and `step_index` is a tensor, so it traces once.
    """

    def on_replica(*replica_chunk):
        x, y, global_count, start = replica_chunk if step_index is None else piece(replica_chunk, step_index)
        context = training_context(model, optimizer, x, start)
        logits, loss, grads = step.loss_and_gradients(model, x, y, global_count, context, piece=True)
        model.apply_updates(context)  # running statistics: this replica's copy, from its own piece
        if primary_model is None:
            grads = all_reduced(grads)
            with tf.name_scope(profile.UPDATE_SCOPE):
                apply_gradients_fused(optimizer, grads, model.trainable)  # XLA; this replica's copies
        return loss, step.correct(model, logits, y), grads

    losses, corrects, grads = strategy.run(on_replica, args=chunk)
    if primary_model is not None:
        grads = update_on_primary(strategy, model, optimizer, primary_model, grads)
    with tf.name_scope(profile.COLLECTIVES_SCOPE):
        return strategy.reduce(SUM, losses, axis=None), strategy.reduce(SUM, corrects, axis=None), grads


def update_on_primary(strategy, model, optimizer, primary_model, grads) -> list:
    """In cross-replica context: the replicas' gradients summed on the first device, the update there, its
    weights copied to every replica and the replicas' running statistics read back; returns the summed gradients."""
    primary = strategy.extended.worker_devices[0]
    with tf.name_scope(profile.COLLECTIVES_SCOPE):
        summed = strategy.extended.batch_reduce_to(SUM, [(grad, primary) for grad in grads])
    summed = [strategy.experimental_local_results(grad)[0] for grad in summed]
    with tf.device(primary), tf.name_scope(profile.UPDATE_SCOPE):  # the reference's update and variables
        apply_gradients_fused(optimizer, summed, primary_model.trainable)
    with tf.name_scope(profile.COLLECTIVES_SCOPE):
        for copies, weight, variable in zip(model.weights, primary_model.weights, model.definition.variables):
            if variable.trainable:
                copies.assign(weight)  # cross-replica context: writes every replica's copy
            else:
                weight.assign(copies)  # the replicas' running statistics, read as their setting aggregates
    return summed


@tf.function
def train_steps(strategy, model, optimizer, chunk, first_step, steps, primary_model=None, record_state: bool = False):
    """`train_step` on global batches first_step .. first_step + steps - 1 of the epoch's chunk, in one call: the
    loop in the graph (the tf.distribute guide's pattern; step.loop_steps), with `record_state` the state checksums
    at the start of each step (replica 0's copies with `replicas`; the first device's plain model and optimizer with
    `primary`: cross-replica context reads them). Returns (losses, corrects, checksums, the call's first step's
    summed gradients, the first device's copy): the run's first call, of one step, gives the first-step gradients
    and every later call runs its trace (one trace for the run: a trace is a large share of a small run's time)."""

    def one_step(i):
        loss, correct, grads = train_step(strategy, model, optimizer, chunk, first_step + i, primary_model)
        return loss, correct, [strategy.experimental_local_results(grad)[0] for grad in grads]

    variables = state_variables(primary_model or model, optimizer)
    zeros = [tf.zeros(weight.shape, weight.dtype) for weight in model.trainable]
    return step.loop_steps(steps, model.weights[0].dtype, variables, record_state, one_step, zeros)


@tf.function
def test_step(strategy, model, pieces):
    """(summed loss, correct count) of a test batch's pieces, each padded to one width and cut to its size in the
    step: every batch of a split has the same shapes, so every worker traces it once (their collectives match)."""

    def on_replica(x, y, size):
        return step.test_sums(model, batch_inputs.take(x, slice(None, size)), y[:size])

    loss_sums, corrects = strategy.run(on_replica, args=pieces)
    return strategy.reduce(SUM, loss_sums, axis=None), strategy.reduce(SUM, corrects, axis=None)


@tf.function
def forward(strategy, model, pieces):
    return strategy.run(model, args=(pieces,))


def predict_logits(strategy, model, x: np.ndarray) -> np.ndarray:
    """Logits for host inputs, each replica computing its contiguous piece: what --export checks against."""
    pieces = distribute_pieces(
        strategy,
        len(batch_inputs.first(x)),
        lambda first, last: batch_inputs.each(tf.constant, batch_inputs.take(x, slice(first, last))),
    )
    logits = forward(strategy, model, pieces)
    return np.concatenate([part.numpy() for part in strategy.experimental_local_results(logits)])


def replica_weight_spread(strategy, model) -> float:
    """Largest difference between any replica's copy of a weight and replica 0's (0 when in sync); running
    statistics, which each replica keeps its own (RUNNING_STATISTICS), are not weights here."""
    replicas = list(zip(*(strategy.experimental_local_results(weight) for weight in model.trainable)))
    first = [copy.numpy() for copy in replicas[0]]
    return max(
        (float(np.max(np.abs(copy.numpy() - value))) for copies in replicas[1:] for copy, value in zip(copies, first)),
        default=0.0,
    )


def record_taps(strategy, model, optimizer, pieces) -> Taps:
    """The forward's tapped values and their gradients on every replica at the current state (no update), each
    joined in batch order (replica 0's piece first)."""
    names, connected = [], []

    @tf.function
    def record():
        def on_replica(x, y, global_count, start):
            context = training_context(model, optimizer, x, start, record=True)
            found, values, gradients = step.tapped_gradients(model, x, y, global_count, context, piece=True)
            if not names:  # traced once per replica: the same taps
                names.extend(found)
                connected.extend(gradient is not None for gradient in gradients)
            return values, [tf.zeros_like(v) if g is None else g for v, g in zip(values, gradients)]

        return strategy.run(on_replica, args=pieces)

    values, gradients = record()
    gradients = [gradient if flowing else None for gradient, flowing in zip(gradients, connected)]

    def joined(value):
        return np.concatenate([part.numpy() for part in strategy.experimental_local_results(value)])

    return step.host_taps(names, values, gradients, joined)


# --- the variables --------------------------------------------------------------------------

# Running statistics (a model's non-trainable variables) as Keras's BatchNormalization makes them: each replica
# updates its own copy from its own piece, and a read outside the replicas (checkpoint, parity, export)
# averages the copies.
RUNNING_STATISTICS = (tf.VariableSynchronization.ON_READ, tf.VariableAggregation.MEAN)
RUNNING_STATISTICS_TEXT = "ON_READ, MEAN: each replica updates its own copy from its piece; a read averages them"


def make_variable(value, variable):
    """A model variable under the strategy's scope: a MirroredVariable, or for running statistics a
    SyncOnReadVariable (RUNNING_STATISTICS)."""
    if variable.trainable:
        return tf.Variable(value)
    synchronization, aggregation = RUNNING_STATISTICS
    return tf.Variable(value, trainable=False, synchronization=synchronization, aggregation=aggregation)


def build_models(strategy, config: Config, update: str):
    """(model, optimizer, primary_model) for the update mode; primary_model is None with "replicas".

    "primary": the optimizer and the weights it updates are plain variables on the first device, and the
    replicas' MirroredVariables are copies of those weights. "replicas": the model and optimizer are
    MirroredVariables, one copy of weights and slots per replica.
    """
    if update == "primary":
        with tf.device(strategy.extended.worker_devices[0]):
            primary_model, optimizer = build_model_and_optimizer(config)
        with strategy.scope():  # copies
            model = Model(
                primary_model.definition,
                [weight.numpy() for weight in primary_model.weights],
                make_variable,
                seed=config.seed,
                compute_dtype=primary_model.compute_dtype,  # a mixed policy's: the replicas compute in it
            )
        return model, optimizer, primary_model
    with strategy.scope():
        model, optimizer = build_model_and_optimizer(config, make_variable)  # MirroredVariables: a copy per replica
    return model, optimizer, None


# --- the trainer ----------------------------------------------------------------------------


def test_piece(x, y: np.ndarray, width: int) -> Callable:
    """distribute_pieces's piece_of for a test batch: a replica's (x, y) padded to `width` examples, and its size."""

    def piece_of(first, last):
        padding = [(0, width - (last - first))]

        def padded(array):
            return tf.constant(np.pad(array[first:last], padding + [(0, 0)] * (array.ndim - 1)))

        return batch_inputs.each(padded, x), padded(y), tf.constant(last - first, tf.int32)

    return piece_of


def make_strategy(config: Config, devices: Sequence[str]):
    """(the strategy, what its collectives run with, the cross-device ops' name for the log line)."""
    if config.clients > 1:  # multi_worker_strategy joined the cluster before anything started the runtime
        implementation_used = Implementation("CollectiveAllReduce", False, "RING across workers")
        return multi_worker_strategy(), implementation_used, "CollectiveAllReduce (RING, multi-worker)"
    cross_device_ops = choose_cross_device_ops(devices)
    strategy = tf.distribute.MirroredStrategy(
        devices=[f"/device:{device}" for device in devices], cross_device_ops=cross_device_ops
    )
    implementation_used = implementation(cross_device_ops, devices, update_mode(config))
    return strategy, implementation_used, type(cross_device_ops).__name__


class MirroredTrainer(Trainer):
    """The parts shared.training.loop.fit calls, with one replica per device (per worker with --clients)."""

    name = "mirrored"
    steps_give_gradients = True  # the first step's call returns its gradients (train_step)

    def __init__(self, config: Config, data: Dataset, devices: Sequence[str], log: Callable = print):
        self.config, self.data = config, data
        self.strategy, self.collectives, cross_device_ops_name = make_strategy(config, devices)
        num_replicas = self.strategy.num_replicas_in_sync
        self.placement = f"{num_replicas} replica{'s' * (num_replicas > 1)} on {devices[0].split(':')[0]}" + (
            f" ({config.clients} workers)" if config.clients > 1 else ""
        )
        update = update_mode(config)
        self.details = {
            "cross_device_ops": cross_device_ops_name,
            "update": update,
            "input": "distribute_datasets_from_function, one element per replica per epoch",
            "per_replica_batch": describe_pieces(config.batch_size, num_replicas),
        }
        if not config.quiet:
            log(
                f"{'mirrored':<10} {self.placement}; cross-device ops {cross_device_ops_name}; update {update}; "
                f"per-replica batch {self.details['per_replica_batch']}; input {self.details['input']}"
            )
        self.model, self.optimizer, self.primary_model = build_models(self.strategy, config, update)
        if self.model.definition.has_running_statistics:
            self.details["running_statistics"] = RUNNING_STATISTICS_TEXT
        self.checkpointed = (self.primary_model or self.model, self.optimizer)
        # Each global batch's label count, set per epoch by train_epoch (shuffled, they move); here for its length.
        self.global_counts = batch_label_counts(data.y_train, config.batch_size, 0, False, 0)

    def begin(self, start_epoch: int):
        """After --restore: the replicas' copies from the primary weights, and the run's input pipeline."""
        if self.primary_model is not None:
            for copies, weight in zip(self.model.weights, self.primary_model.weights):
                copies.assign(weight)  # every replica's copy from the restored (or initial) weights
        config, data = self.config, self.data
        epochs = range(start_epoch, config.epochs)
        self.train_iterator = iter(
            distribute_batches(
                self.strategy, data.x_train, data.y_train, config.batch_size, epochs or [0], config.shuffle, config.seed
            )
        )
        self.chunk = next(self.train_iterator)  # the first epoch's pieces

    def gradients(self, x, y):
        pieces = replica_values(self.strategy, x, y)
        return self.host_gradients(global_gradients(self.strategy, self.model, self.optimizer, pieces))

    def host_gradients(self, grads):
        """Summed gradients as host arrays: the first replica's copy (every replica holds the same sum)."""
        return [self.strategy.experimental_local_results(g)[0].numpy() for g in grads]

    def taps(self, x, y) -> Taps:
        return record_taps(self.strategy, self.model, self.optimizer, replica_values(self.strategy, x, y))

    def step(self, x, y):
        pieces = replica_values(self.strategy, x, y)
        train_step(self.strategy, self.model, self.optimizer, pieces, None, self.primary_model)

    def train_epoch(self, epoch: int, meter, first: bool, record_state: bool):
        if not first:
            self.chunk = next(self.train_iterator)  # prepared while the previous epoch trained
        config = self.config
        self.global_counts = batch_label_counts(
            self.data.y_train, config.batch_size, epoch, config.shuffle, config.seed
        )
        steps = len(self.global_counts)
        calls = [(0, 1), (1, steps - 1)] if first and steps > 1 else [(0, steps)]  # the first step alone: its trace
        for start, count in calls:
            losses, corrects, checksums, grads = train_steps(
                self.strategy,
                self.model,
                self.optimizer,
                self.chunk,
                tf.constant(start),
                tf.constant(count),
                self.primary_model,
                record_state,
            )
            if first and start == 0:
                self.first_grads = grads  # read back after the epoch: first_call_gradients
            meter.add_steps(
                losses, corrects, self.global_counts[start : start + count], checksums if record_state else None
            )

    def trace_count(self) -> int:
        return train_step.experimental_get_tracing_count() + train_steps.experimental_get_tracing_count()

    def step_call(self, most_steps: int = 0) -> profile.StepCall:
        """A measured epoch's call, every step of the last epoch's element (tf.data made it ahead); with
        `most_steps` (the step count is a tensor: the same trace), its first steps in as few equal calls as make
        them: a round of 10 in an epoch of 8 is two calls of 5, not of 8 (the GPT's: 16 steps a round)."""
        length, steps = len(self.global_counts), len(self.global_counts)
        if most_steps:
            calls = -(-most_steps // length)  # the fewest calls of at most an epoch's steps
            steps = -(-most_steps // calls)
        examples = len(self.data.y_train) if steps == length else steps * self.config.batch_size

        def run(chunk):
            train_steps(
                self.strategy, self.model, self.optimizer, chunk, tf.constant(0), tf.constant(steps), self.primary_model
            )[0].numpy()  # host sync: the call has run

        return profile.StepCall(steps, lambda: self.chunk, run, examples=examples)

    def test_batches(self, x, y):
        """Each global batch as every replica's (x, y, size) piece, padded to one width."""
        width = -(-self.config.batch_size // self.strategy.num_replicas_in_sync)  # the largest piece of any batch
        for x_batch, y_batch in epoch_batches(x, y, self.config.batch_size):
            yield distribute_pieces(self.strategy, len(y_batch), test_piece(x_batch, y_batch, width))

    def test_step(self, batch):
        return test_step(self.strategy, self.model, batch)

    def state(self):
        """The primary copy with "primary"; with "replicas" replica 0's copies are read."""
        return state_variables(self.primary_model or self.model, self.optimizer)

    def final_weights(self):
        return [w.numpy() for w in self.model.weights]

    def per_device(self, variables):
        """Every replica's copy of each MirroredVariable; a plain variable (the primary update's) is itself."""
        return [copy for variable in variables for copy in self.strategy.experimental_local_results(variable)]

    def held_variables(self):
        """With "primary", the first device's plain weights besides the replicas' copies."""
        weights, optimizer_state = super().held_variables()
        return weights + (list(self.primary_model.weights) if self.primary_model is not None else []), optimizer_state

    def predict_logits(self, x: np.ndarray) -> np.ndarray:
        return predict_logits(self.strategy, self.model, x)

    def finish(self, history: History):
        history.details["replica_weight_spread"] = f"{replica_weight_spread(self.strategy, self.model):.3g}"
