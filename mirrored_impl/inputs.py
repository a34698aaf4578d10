"""Each global batch as every replica's contiguous piece, replica 0 first: for training, one distributed
dataset element per replica per epoch; for anything else (first-step gradients, taps, evaluation, logits),
per-replica values cut from a host batch. Each piece carries its global batch's count of counted labels (the
loss's divisor) and where it starts in the global batch (what dropout draws from)."""

from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from dtensor_vs_mirrored.shared.measure import profile
from dtensor_vs_mirrored.shared.training import batch_inputs
from dtensor_vs_mirrored.shared.training.batches import (
    batch_slices,
    epoch_batches,
    example_label_counts,
    without_autotune,
)


def piece_sizes(global_count: int, num_replicas: int):
    """Contiguous per-replica shares of a global batch, replica 0 first: 44 over 8 is 6,6,6,6,5,5,5,5."""
    return [global_count // num_replicas + (replica < global_count % num_replicas) for replica in range(num_replicas)]


def describe_pieces(global_count: int, num_replicas: int) -> str:
    """piece_sizes as the tables show them: "16", or "7-8" when they differ."""
    sizes = piece_sizes(global_count, num_replicas)
    return f"{min(sizes)}" if min(sizes) == max(sizes) else f"{min(sizes)}-{max(sizes)}"


def replica_chunks(
    label_counts: np.ndarray, batch_size: int, num_replicas: int, epochs: Sequence[int], shuffle: bool, seed: int
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Which examples each replica takes at each step, epoch by epoch: (indices, sizes, global_counts, starts).

    The global batches of `epoch_batches` for `epochs`, cut into `piece_sizes` contiguous pieces,
    replica 0 first. indices [epochs, N, steps, P] holds replica r's piece of step s in its first
    sizes[e, r, s] entries (P = the largest piece; the rest repeat example 0 and are cut off);
    global_counts [epochs, N, steps] is each global batch's count of counted labels (label_counts: per example);
    starts [epochs, N, steps] is where replica r's piece starts in its global batch.
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
    strategy, x, y: np.ndarray, batch_size: int, epochs: Sequence[int], shuffle: bool = False, seed: int = 0
):
    """The global batches of `epochs` as one distributed dataset: per epoch, each replica's pieces of
    every step, (x [steps, P, ...], y [steps, P, ...], sizes [steps], global counts [steps], starts [steps]).

    One element per replica per epoch, not per step (tf.data's per-element work took most of an epoch's CPU time
    at 8 replicas), padded to the largest piece; `piece` cuts each step's piece out in the step. One dataset, so
    one iterator, for the whole run; take exactly one element per epoch (docs/trainers.md, MirroredStrategy's
    "Input").
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
        images, labels = batch_inputs.each(tf.constant, x), tf.constant(y)

        def take_chunk(index, size, global_count, start):
            pieces = batch_inputs.each(lambda inputs: tf.gather(inputs, index), images)
            return pieces, tf.gather(labels, index), size, global_count, start

        chunks = tuple(
            array[:, local].reshape(-1, *array.shape[2:]) for array in (indices, sizes, global_counts, starts)
        )
        pipeline = tf.data.Dataset.from_tensor_slices(chunks).map(take_chunk).prefetch(local_replicas)
        return pipeline.with_options(without_autotune())

    # Already per replica: a pipeline of L replicas hands L consecutive elements to them in order.
    return strategy.distribute_datasets_from_function(dataset_fn, pipeline_per_replica(strategy))


def pipeline_per_replica(strategy) -> Optional[tf.distribute.InputOptions]:
    """In one process, one input pipeline per replica on its own device, autotuning off (None across workers):
    by default one pipeline feeds a MultiDeviceIterator whose per-device iterators autotune out of the trainer's
    reach, and deleting them at the end of a run waited for their tuning threads (docs/trainers.md)."""
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
        x = batch_inputs.take(x, (step, slice(None, sizes[step])))
        return x, y[step, : sizes[step]], global_counts[step], starts[step]


def distribute_pieces(strategy, count: int, piece_of: Callable):
    """Per-replica values of a host batch of `count` examples cut as piece_sizes cuts it: replica r gets
    piece_of(first, last), its examples first..last-1."""
    bounds = np.cumsum([0] + piece_sizes(count, strategy.num_replicas_in_sync))

    def value(context: tf.distribute.experimental.ValueContext):
        replica = context.replica_id_in_sync_group
        return piece_of(bounds[replica], bounds[replica + 1])

    return strategy.experimental_distribute_values_from_function(value)


def replica_values(strategy, x, y: np.ndarray):
    """One global batch as every replica's (x, y, global count, start) piece, as the training pipeline cuts it."""
    count = int(example_label_counts(y).sum())

    def piece_of(first, last):
        return (
            batch_inputs.each(tf.constant, batch_inputs.take(x, slice(first, last))),
            tf.constant(y[first:last]),
            tf.constant(count, tf.int64),
            tf.constant(first, tf.int64),
        )

    return distribute_pieces(strategy, len(y), piece_of)
