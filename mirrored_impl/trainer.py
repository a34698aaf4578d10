"""The MirroredStrategy trainer: the reference's training run, data-parallel under tf.distribute.

    python compare.py --trainers reference,mirrored --data embedded

Like TensorFlow's "Custom training with tf.distribute.Strategy": `MirroredStrategy` over exactly the
given devices, the model's variables as MirroredVariables, each global batch cut into contiguous
per-replica pieces (one input element per replica per epoch), each replica's loss divided by the
global batch's real count, and the update either once on the first device (`--mirrored-update
primary`) or on every replica after an all-reduce (`replicas`; the only mode across workers).
With `--clients C` it is MultiWorkerMirroredStrategy. Design, departures and costs: docs/trainers.md.
"""

import functools
import json
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from shared.config import Config
from shared.errors import UsageError
from shared.measure import profile, traffic
from shared.measure.checksums import read_state_checksums, state_checksums, state_variables
from shared.measure.history import History
from shared.measure.memory import DeviceMemory, located_bytes, tally
from shared.measure.taps import Taps
from shared.measure.traffic import Implementation
from shared.model.definition import Model
from shared.training import loop
from shared.training.batches import (
    batch_label_counts,
    batch_slices,
    epoch_batches,
    example_label_counts,
    without_autotune,
)
from shared.training.build import build_model_and_optimizer
from shared.training.data import Dataset
from shared.training.losses import correct_count, host_label_count, loss_sum, mean_loss
from shared.training.optim import apply_gradients_fused, dense
from shared.training.protocol import ClusterRole, RunFacts, Trainer, Variant

SUM = tf.distribute.ReduceOp.SUM
COLLECTIVE_TIMEOUT_S = 60  # --clients: longest wait for a peer in one collective (first step: tracing skew)


UPDATE_MODES = ("primary", "replicas")  # --mirrored-update, besides auto; see train_step


def update_mode(config: Config) -> str:
    """--mirrored-update: "primary" or "replicas"; auto is primary in one process, replicas with --clients.

    Multi-worker has no device that every worker's gradients could be summed on cheaply,
    so each worker updates its own copy there.
    """
    if config.mirrored_update == "auto":
        return "replicas" if config.clients > 1 else "primary"
    return config.mirrored_update


def check_config(config: Config, devices: Sequence[str]) -> None:
    """Reject devices TensorFlow cannot provide and global batches smaller than the replica count.

    compare.py runs this before anything trains; `fit` runs it again.
    """
    update_mode(config)
    batch_size = config.batch_size
    if config.clients > 1:  # MultiWorkerMirroredStrategy: one replica per worker on CPU (see fit)
        if batch_size < config.clients:
            raise UsageError(
                f"--batch-size {batch_size} is smaller than the {config.clients} workers; "
                f"use --batch-size {config.clients} or more"
            )
        return
    device_type = devices[0].split(":")[0]
    configured = {device.name.replace("/device:", "") for device in tf.config.list_logical_devices()}
    missing = [device for device in devices if device not in configured]
    if missing:
        available = len(tf.config.list_logical_devices(device_type))
        raise UsageError(
            f"--devices {len(devices)}: {', '.join(missing)} not configured; TensorFlow "
            f"has {available} logical {device_type}s, use --devices {available} or fewer"
        )
    if batch_size < len(devices):
        raise UsageError(
            f"--batch-size {batch_size} is smaller than the {len(devices)} replicas, so some "
            f"replicas would never see an example; use --batch-size {len(devices)} or more, "
            f"or --devices {batch_size} or fewer"
        )


def choose_cross_device_ops(devices: Sequence[str]) -> tf.distribute.CrossDeviceOps:
    """NCCL across separate physical GPUs; otherwise reduce to one device and broadcast back.

    NCCL needs one physical GPU per replica: on logical GPUs split from one physical GPU
    it does not work (TensorFlow's own selection falls back to ReductionToOneDevice there),
    and on CPUs it does not exist, so these reduce to one device.

    Chosen here, not left to TensorFlow: given no `cross_device_ops`, TF 2.21's
    MirroredStrategy all-reduces with CollectiveAllReduce (RING on CPUs), whose group keys
    start at 1 for every strategy, so a 2-replica then an 8-replica strategy in one process
    (a device sweep, the tests) abort with "joining a group with size8, but that group has
    size 2". ReductionToOneDevice and NcclAllReduce keep no such process-wide state.
    """
    all_gpus = all(device.upper().startswith("GPU") for device in devices)
    one_physical_gpu_each = len(tf.config.list_logical_devices("GPU")) == len(tf.config.list_physical_devices("GPU"))
    if all_gpus and one_physical_gpu_each and len(devices) > 1:
        return tf.distribute.NcclAllReduce()
    return tf.distribute.ReductionToOneDevice()


def implementation(
    cross_device_ops: tf.distribute.CrossDeviceOps, devices: Sequence[str], update: str
) -> Implementation:
    """What the gradients' sum ran with, and why, for the result rows: choose_cross_device_ops's choice, except
    that NcclAllReduce sums onto one destination (`primary`) with ReductionToOneDevice (cross_device_ops.py)."""
    name = type(cross_device_ops).__name__
    if isinstance(cross_device_ops, tf.distribute.NcclAllReduce):
        if update == "primary":
            return Implementation(
                "ReductionToOneDevice", False, "the primary update sums on one device: NcclAllReduce falls back to it"
            )
        return Implementation(name, True, "one physical GPU per replica")
    if devices[0].upper().startswith("CPU"):
        return Implementation(name, False, "CPUs have no NCCL")
    return Implementation(name, False, "one replica" if len(devices) == 1 else "NCCL needs one physical GPU each")


@functools.lru_cache(maxsize=1)
def multi_worker_strategy():
    """--clients: MultiWorkerMirroredStrategy over the workers that TF_CONFIG names, one per process.

    The first call joins the cluster (shared/run/clients.py makes it early, before loading
    data, which may start TensorFlow's runtime); `fit` gets the same strategy.

    On CPU it makes one replica per worker, whatever the logical CPU count. It must be
    created before anything initialises TensorFlow's runtime in this process. A peer that
    dies is caught by the coordination service's heartbeat; COLLECTIVE_TIMEOUT_S bounds
    a collective that waits for a peer that is alive but stuck.
    """
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING, timeout_seconds=COLLECTIVE_TIMEOUT_S
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def process_environment(config: Config) -> Dict[str, str]:
    """One intra-op thread on logical CPUs, as DTensor's (docs/throughput.md, "Threads": 1.1-1.7x faster)."""
    return {"TF_NUM_INTRAOP_THREADS": "1"} if config.device_type == "CPU" else {}


def describe_run(config: Config) -> RunFacts:
    """The header's facts: MultiWorkerMirroredStrategy has one replica per worker (--clients)."""
    replicas = config.clients if config.clients > 1 else config.devices
    return RunFacts("", f"{describe_pieces(config.batch_size, replicas)} (MirroredStrategy)")


def variants(config: Config, count: int, every_layout: bool, meshes: Sequence[str] = ()) -> List[Variant]:
    """Its configurations at `count` devices: each update mode for the sweep, or the run's own."""
    updates = UPDATE_MODES if every_layout and not meshes else (update_mode(config),)
    return [
        Variant("mirrored", config.replace(devices=count, mirrored_update=update, shard_weights=False), update=update)
        for update in updates
    ]


def before_runtime(config: Config, device_count: int) -> None:
    """Nothing: MirroredStrategy chooses its collectives when it is made (choose_cross_device_ops)."""


# --- several processes (--clients): MultiWorkerMirroredStrategy -------------------------------


def cluster_variables() -> Tuple[str, ...]:
    return ("TF_CONFIG",)


def cluster_role(config: Config, environ: Mapping[str, str]) -> Optional[ClusterRole]:
    """This worker's place from TF_CONFIG; None when it is not set."""
    if "TF_CONFIG" not in environ:
        return None
    try:
        tf_config = json.loads(environ["TF_CONFIG"])
        workers, index = tf_config["cluster"]["worker"], int(tf_config["task"]["index"])
    except (ValueError, KeyError, TypeError):
        raise UsageError(
            'TF_CONFIG is not {"cluster": {"worker": [...]}, "task": {"type": "worker", '
            '"index": I}}; fix it or unset it'
        ) from None
    return ClusterRole(
        index, len(workers), "TF_CONFIG", workers[index] if 0 <= index < len(workers) else "", "TF_CONFIG"
    )


def client_environment(client_id: int, addresses: Sequence[str]) -> Dict[str, str]:
    return {
        "TF_CONFIG": json.dumps(
            {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": client_id}}
        )
    }


def join_cluster(config: Config) -> None:
    """--clients: join the workers that TF_CONFIG names, before anything else starts TensorFlow's runtime."""
    multi_worker_strategy()


def piece_sizes(global_count: int, num_replicas: int):
    """Contiguous per-replica shares of a global batch, replica 0 first: 44 over 8 is 6,6,6,6,5,5,5,5."""
    return [global_count // num_replicas + (replica < global_count % num_replicas) for replica in range(num_replicas)]


def describe_pieces(global_count: int, num_replicas: int) -> str:
    """piece_sizes as the tables show them: "16", or "7-8" when they differ."""
    sizes = piece_sizes(global_count, num_replicas)
    return f"{min(sizes)}" if min(sizes) == max(sizes) else f"{min(sizes)}-{max(sizes)}"


def replica_chunks(
    label_counts: np.ndarray, batch_size: int, num_replicas: int, epochs: Sequence[int], shuffle: bool, seed: int
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which examples each replica takes at each step, epoch by epoch: (indices, sizes, global_counts, starts).

    The global batches of `epoch_batches` for `epochs`, cut into `piece_sizes` contiguous pieces,
    replica 0 first. indices [epochs, N, steps, P] holds replica r's piece of step s in its first
    sizes[e, r, s] entries (P = the largest piece; the rest repeat example 0 and are cut off);
    global_counts [epochs, N, steps] is each global batch's count of counted labels (label_counts: per example);
    starts [epochs, N, steps] is where replica r's piece starts in its global batch (what dropout draws from).
    """
    num_examples = len(label_counts)
    steps = len(batch_slices(num_examples, batch_size))
    width = -(-batch_size // num_replicas)
    indices = np.zeros((len(epochs), num_replicas, steps, width), np.int64)
    sizes = np.zeros((len(epochs), num_replicas, steps), np.int32)  # int32: sliced with the int32 step
    global_counts = np.zeros((len(epochs), num_replicas, steps), np.int64)
    starts = np.zeros((len(epochs), num_replicas, steps), np.int64)
    example_ids = np.arange(num_examples)
    for e, epoch in enumerate(epochs):
        for step, (batch, _) in enumerate(epoch_batches(example_ids, example_ids, batch_size, epoch, shuffle, seed)):
            start = 0
            for replica, size in enumerate(piece_sizes(len(batch), num_replicas)):
                indices[e, replica, step, :size] = batch[start : start + size]
                sizes[e, replica, step], global_counts[e, replica, step] = size, label_counts[batch].sum()
                starts[e, replica, step] = start
                start += size
    return indices, sizes, global_counts, starts


def distribute_batches(
    strategy, x: np.ndarray, y: np.ndarray, batch_size: int, epochs: Sequence[int], shuffle: bool = False, seed: int = 0
):
    """The global batches of `epochs` as one distributed dataset: per epoch, each replica's pieces of
    every step, (x [steps, P, 784], y [steps, P], sizes [steps], global counts [steps], starts [steps]).

    One element per replica per epoch, not per step: tf.data's per-element work (the iterator,
    the prefetch to each device) took most of a reference epoch's CPU time at 8 replicas
    (docs/throughput.md); `piece` cuts each step's piece out in the step. An epoch's pieces are
    padded to the largest (1.6 MB per replica at 8 replicas, default data); one epoch is
    prepared ahead. One dataset, so one iterator, for the whole run: creating a distributed
    iterator costs ~0.3 s at 8 replicas, and creating one while another was alive and prefetching
    stalled for up to 20 s here. Take exactly one element per epoch: asking for one more waits
    for every replica's end of data (stalls of seconds here too).
    """

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        num_replicas = input_context.num_replicas_in_sync
        label_counts = example_label_counts(y)
        indices, sizes, global_counts, starts = replica_chunks(
            label_counts, batch_size, num_replicas, epochs, shuffle, seed
        )
        # Each pipeline feeds only its own replicas: worker w's replicas w*L .. w*L+L-1 across
        # workers, one replica's in one process (pipeline_per_replica).
        local_replicas = num_replicas // input_context.num_input_pipelines
        local = slice(
            input_context.input_pipeline_id * local_replicas, (input_context.input_pipeline_id + 1) * local_replicas
        )
        images, labels = tf.constant(x), tf.constant(y)

        def take_chunk(index, size, global_count, start):
            return tf.gather(images, index), tf.gather(labels, index), size, global_count, start

        chunks = tuple(
            array[:, local].reshape(-1, *array.shape[2:]) for array in (indices, sizes, global_counts, starts)
        )
        pipeline = tf.data.Dataset.from_tensor_slices(chunks).map(take_chunk).prefetch(local_replicas)
        return pipeline.with_options(without_autotune())

    # Already per replica: a pipeline of L replicas hands L consecutive elements to them in order.
    return strategy.distribute_datasets_from_function(dataset_fn, pipeline_per_replica(strategy))


def pipeline_per_replica(strategy) -> Optional[tf.distribute.InputOptions]:
    """In one process, one input pipeline per replica on its own device, autotuning off (None across workers).

    By default one pipeline feeds a MultiDeviceIterator, which gives every device an iterator
    of its own with tf.data's autotuning on, out of the trainer's reach; deleting those at the
    end of `fit` waited for their tuning threads' back-off. Measured (TF 2.21, 8 replicas,
    512 examples, 2 epochs, a busy 2-core machine): fit took 205-267 s by default, 5-9 s with
    this, the same losses. Each pipeline then yields only its replica's pieces (dataset_fn).
    """
    if not isinstance(strategy, tf.distribute.MirroredStrategy):
        return None
    return tf.distribute.InputOptions(
        experimental_fetch_to_device=False,
        experimental_place_dataset_on_device=True,
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
    )


def piece(chunk, step):
    """In replica context: this replica's (x, y, global count, start in the global batch) of step `step`."""
    x, y, sizes, global_counts, starts = chunk
    with tf.name_scope(profile.INPUT_SCOPE):  # the scopes name the step's parts for --profile
        return x[step, : sizes[step]], y[step, : sizes[step]], global_counts[step], starts[step]


def training_context(model, optimizer, x, start, record: bool = False):
    """The forward's context on a replica: its examples sit at start.. in the global batch."""
    positions = start + tf.range(tf.shape(x, out_type=tf.int64)[0])
    return model.training_context(optimizer.step, positions, record)


def replica_loss_and_gradients(model, optimizer, x, y, global_count, start):
    """(logits, this replica's loss share, its gradients of the global mean loss, not yet summed, the forward's
    context with its running statistics' updates)."""
    context = training_context(model, optimizer, x, start)
    with tf.GradientTape() as tape:
        with tf.name_scope(profile.FORWARD_SCOPE):
            logits = model(x, context)
            loss = mean_loss(logits, y, global_count, loss=model.definition.loss)
    return logits, loss, dense(tape.gradient(loss, model.trainable)), context


def all_reduced(grads):
    """In replica context: every replica gets the sum of all replicas' gradients.

    ReductionToOneDevice on CPU: sum on one device, copy back to each (see choose_cross_device_ops).
    """
    with tf.name_scope(profile.COLLECTIVES_SCOPE):
        return tf.distribute.get_replica_context().all_reduce(SUM, grads)


@tf.function
def global_gradients(strategy, model, optimizer, chunk, step):
    """The gradients of the global mean loss at the current weights, as every replica sees them."""

    def on_replica(*replica_chunk):
        return all_reduced(replica_loss_and_gradients(model, optimizer, *piece(replica_chunk, step))[2])

    return strategy.run(on_replica, args=chunk)


@tf.function
def train_step(strategy, model, optimizer, chunk, step, primary_model=None):
    """One optimizer step on global batch `step` of the epoch's `chunk`; returns (mean loss, correct
    count) before the update.

    primary_model None ("replicas", the tf.distribute tutorial's pattern): the gradients are
    all-reduced and every replica applies the optimizer to its own copies. Otherwise
    ("primary"): the gradients are summed on the first device only, the optimizer updates
    `primary_model` there once, and its weights are copied to every replica's copy.

    Every epoch's chunk has the same shapes and `step` is a tensor, so it traces once (per
    replica: strategy.run traces its function N times); the pieces' sizes vary inside the graph.
    """

    def on_replica(*replica_chunk):
        x, y, global_count, start = piece(replica_chunk, step)
        logits, loss, grads, context = replica_loss_and_gradients(model, optimizer, x, y, global_count, start)
        model.apply_updates(context)  # running statistics: this replica's copy, from its own piece
        if primary_model is None:
            summed = all_reduced(grads)
            with tf.name_scope(profile.UPDATE_SCOPE):
                apply_gradients_fused(optimizer, summed, model.trainable)  # XLA; this replica's copies
            grads = []
        return loss, correct_count(logits, y), grads

    losses, corrects, grads = strategy.run(on_replica, args=chunk)
    if primary_model is not None:
        primary = strategy.extended.worker_devices[0]
        with tf.name_scope(profile.COLLECTIVES_SCOPE):
            summed = strategy.extended.batch_reduce_to(SUM, [(grad, primary) for grad in grads])
        with tf.device(primary), tf.name_scope(profile.UPDATE_SCOPE):  # the reference's update and variables
            apply_gradients_fused(
                optimizer, [strategy.experimental_local_results(grad)[0] for grad in summed], primary_model.trainable
            )
        with tf.name_scope(profile.COLLECTIVES_SCOPE):
            for copies, weight, variable in zip(model.weights, primary_model.weights, model.definition.variables):
                if variable.trainable:
                    copies.assign(weight)  # cross-replica context: writes every replica's copy
                else:
                    weight.assign(copies)  # the replicas' running statistics, read as their setting aggregates
    with tf.name_scope(profile.COLLECTIVES_SCOPE):
        return strategy.reduce(SUM, losses, axis=None), strategy.reduce(SUM, corrects, axis=None)


@tf.function
def train_steps(strategy, model, optimizer, chunk, first_step, steps, primary_model=None, record_state: bool = False):
    """`train_step` on global batches first_step .. first_step + steps - 1 of the epoch's chunk, in one call.

    The loop runs in the graph (the tf.distribute guide's pattern for several steps per
    tf.function call); returns [steps] tensors of the per-step losses and correct counts,
    and with `record_state` the state checksums at the start of each step (replica 0's copies
    with `replicas`; the first device's plain model and optimizer with `primary`).
    """
    losses = tf.TensorArray(model.weights[0].dtype, size=steps)
    corrects = tf.TensorArray(tf.float32, size=steps)
    variables = state_variables(primary_model or model, optimizer)
    checksums = tf.TensorArray(tf.float64, size=steps if record_state else 0, element_shape=[len(variables)])
    for i in tf.range(steps):
        if record_state:  # Python bool: decided when traced; cross-replica context reads replica 0's copy
            checksums = checksums.write(i, state_checksums(variables))
        loss, correct = train_step(strategy, model, optimizer, chunk, first_step + i, primary_model)
        losses, corrects = losses.write(i, loss), corrects.write(i, correct)
    return losses.stack(), corrects.stack(), checksums.stack()


@tf.function
def test_step(strategy, model, chunk, step):
    def on_replica(*replica_chunk):
        x, y, _, _ = piece(replica_chunk, step)
        logits = model(x)
        return loss_sum(logits, y, loss=model.definition.loss), correct_count(logits, y)

    loss_sums, corrects = strategy.run(on_replica, args=chunk)
    return strategy.reduce(SUM, loss_sums, axis=None), strategy.reduce(SUM, corrects, axis=None)


def evaluate(strategy, model, chunk, num_batches: int, num_labels: int):
    """(mean loss, accuracy) over a whole split: the `num_batches` global batches of `chunk`; one host sync."""
    total_loss, total_correct = 0.0, 0.0
    for step in range(num_batches):
        batch_loss, batch_correct = test_step(strategy, model, chunk, tf.constant(step))
        total_loss, total_correct = total_loss + batch_loss, total_correct + batch_correct
    return float(total_loss) / num_labels, float(total_correct) / num_labels


@tf.function
def forward(strategy, model, pieces):
    return strategy.run(model, args=(pieces,))


def distribute_pieces(strategy, count: int, piece_of: Callable):
    """Per-replica values of a host batch of `count` examples cut as piece_sizes cuts it: replica r gets
    piece_of(first, last), its examples first..last-1."""
    bounds = np.cumsum([0] + piece_sizes(count, strategy.num_replicas_in_sync))

    def value(context: tf.distribute.experimental.ValueContext):
        replica = context.replica_id_in_sync_group
        return piece_of(bounds[replica], bounds[replica + 1])

    return strategy.experimental_distribute_values_from_function(value)


def predict_logits(strategy, model, x: np.ndarray) -> np.ndarray:
    """Logits for host images, each replica computing its contiguous piece: what --export checks against."""
    pieces = distribute_pieces(strategy, len(x), lambda first, last: tf.constant(x[first:last]))
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


def replica_values(strategy, x: np.ndarray, y: np.ndarray):
    """One global batch as every replica's (x, y, global count, start) piece, as the training pipeline cuts it."""
    count = int(example_label_counts(y).sum())

    def piece_of(first, last):
        return (
            tf.constant(x[first:last]),
            tf.constant(y[first:last]),
            tf.constant(count, tf.int64),
            tf.constant(first, tf.int64),
        )

    return distribute_pieces(strategy, len(y), piece_of)


def record_taps(strategy, model, optimizer, pieces) -> Taps:
    """The forward's tapped values and their gradients on every replica at the current state (no update), each
    joined in batch order (replica 0's piece first)."""
    names, connected = [], []

    @tf.function
    def record():
        def on_replica(x, y, global_count, start):
            context = training_context(model, optimizer, x, start, record=True)
            with tf.GradientTape() as tape:
                loss = mean_loss(model(x, context), y, global_count, loss=model.definition.loss)
            values = [value for _, value in context.taps]
            gradients = tape.gradient(loss, values)
            if not names:  # traced once per replica: the same taps
                names.extend(name for name, _ in context.taps)
                connected.extend(gradient is not None for gradient in gradients)
            return values, [tf.zeros_like(v) if g is None else g for v, g in zip(values, gradients)]

        return strategy.run(on_replica, args=pieces)

    values, gradients = record()

    def joined(value):
        return np.concatenate([part.numpy() for part in strategy.experimental_local_results(value)])

    return Taps(
        names,
        [joined(value) for value in values],
        [joined(gradient) if flowing else None for gradient, flowing in zip(gradients, connected)],
    )


def build_models(strategy, config: Config, update: str):
    """(model, optimizer, primary_model) for the update mode; primary_model is None with "replicas".

    "primary": the optimizer and the weights it updates are plain variables on the first
    device, and the replicas' MirroredVariables are copies of those weights. "replicas": the
    model and optimizer are MirroredVariables, one copy of weights and slots per replica.
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
            )
        return model, optimizer, primary_model
    with strategy.scope():
        model, optimizer = build_model_and_optimizer(config, make_variable)  # MirroredVariables: a copy per replica
    return model, optimizer, None


def memory_per_device(strategy, model, optimizer, primary_model: Optional[object]) -> List[DeviceMemory]:
    """Bytes of weights and optimizer state on each device: every replica's copy of each
    MirroredVariable, plus the first device's plain weights with "primary" (where the optimizer
    state is plain too: experimental_local_results gives a plain variable back as itself)."""

    def copies(variables):
        return located_bytes(copy for variable in variables for copy in strategy.experimental_local_results(variable))

    weights = copies(model.weights) + (located_bytes(primary_model.weights) if primary_model is not None else [])
    return tally(weights, copies(optimizer.variables))


class MirroredTrainer(Trainer):
    """The parts shared.training.loop.fit calls, with one replica per device (per worker with --clients)."""

    name = "mirrored"

    def __init__(self, config: Config, data: Dataset, devices: Sequence[str], log: Callable = print):
        if config.clients > 1:
            self.strategy = multi_worker_strategy()  # first: before anything starts TensorFlow's runtime
            check_config(config, devices)
            cross_device_ops_name = "CollectiveAllReduce (RING, multi-worker)"
            self.collectives = Implementation("CollectiveAllReduce", False, "RING across workers")
        else:
            check_config(config, devices)
            cross_device_ops = choose_cross_device_ops(devices)
            self.strategy = tf.distribute.MirroredStrategy(
                devices=[f"/device:{device}" for device in devices], cross_device_ops=cross_device_ops
            )
            cross_device_ops_name = type(cross_device_ops).__name__
            self.collectives = implementation(cross_device_ops, devices, update_mode(config))
        self.config, self.data = config, data
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
        """After --restore: the replicas' copies from the primary weights, and the run's input pipelines."""
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
        self.test_iterator = iter(
            distribute_batches(self.strategy, data.x_test, data.y_test, config.batch_size, epochs)
        )
        self.chunk = next(self.train_iterator)  # the first epoch's pieces

    def gradients(self, x, y):
        """At the current weights, on the first global batch of the chunk: the same batch as x, y."""
        grads = global_gradients(self.strategy, self.model, self.optimizer, self.chunk, tf.constant(0))
        return [self.strategy.experimental_local_results(g)[0].numpy() for g in grads]

    def taps(self, x, y) -> Taps:
        return record_taps(self.strategy, self.model, self.optimizer, replica_values(self.strategy, x, y))

    def train_epoch(self, epoch: int, meter, first: bool, record_state: bool):
        if not first:
            self.chunk = next(self.train_iterator)  # prepared while the previous epoch trained
        config = self.config
        self.global_counts = batch_label_counts(
            self.data.y_train, config.batch_size, epoch, config.shuffle, config.seed
        )
        done = 0
        if first:  # the first step alone: its time is the trace time
            initial_state = read_state_checksums(self.state()) if record_state else None
            loss, correct = train_step(
                self.strategy, self.model, self.optimizer, self.chunk, tf.constant(0), self.primary_model
            )
            float(loss)  # host sync, once
            meter.add(loss, correct, self.global_counts[0], initial_state)
            done = 1
        if done < len(self.global_counts):  # the rest of the epoch in one call
            losses, corrects, checksums = train_steps(
                self.strategy,
                self.model,
                self.optimizer,
                self.chunk,
                tf.constant(done),
                tf.constant(len(self.global_counts) - done),
                self.primary_model,
                record_state,
            )
            meter.add_steps(losses, corrects, self.global_counts[done:], checksums if record_state else None)

    def trace_count(self) -> int:
        return train_step.experimental_get_tracing_count() + train_steps.experimental_get_tracing_count()

    def step_call(self) -> profile.StepCall:
        """--profile: a measured epoch's call, every step of the last epoch's element (tf.data made it ahead)."""
        steps = len(self.global_counts)

        def run(chunk):
            train_steps(
                self.strategy, self.model, self.optimizer, chunk, tf.constant(0), tf.constant(steps), self.primary_model
            )[0].numpy()  # host sync: the call has run

        step = train_step.get_concrete_function(
            self.strategy, self.model, self.optimizer, self.chunk, tf.constant(0), self.primary_model
        )
        return profile.StepCall(steps, lambda: self.chunk, run, lambda: traffic.cross_device_traffic(step))

    def evaluate(self, x, y):
        """The test split's pieces for this epoch come from the test pipeline (x, y are the same examples)."""
        return evaluate(
            self.strategy,
            self.model,
            next(self.test_iterator),
            len(batch_slices(len(y), self.config.batch_size)),
            host_label_count(y),
        )

    def state(self):
        """The primary copy with "primary"; with "replicas" replica 0's copies are read."""
        return state_variables(self.primary_model or self.model, self.optimizer)

    def final_weights(self):
        return [w.numpy() for w in self.model.weights]

    def memory_per_device(self):
        return memory_per_device(self.strategy, self.model, self.optimizer, self.primary_model)

    def predict_logits(self, x: np.ndarray) -> np.ndarray:
        return predict_logits(self.strategy, self.model, x)

    def finish(self, history: History):
        history.details["replica_weight_spread"] = f"{replica_weight_spread(self.strategy, self.model):.3g}"


def fit(config: Config, data: Dataset, devices: Sequence[str], log: Callable = print) -> History:
    """Train data-parallel with one replica per device and return the shared history record."""
    return loop.fit(MirroredTrainer(config, data, devices, log), config, data, log)
