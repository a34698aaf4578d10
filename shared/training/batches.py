"""The batch sequence every trainer trains on: one epoch's order, its global batches (the final partial batch
kept), runs of equal shape for calls of several steps, and tf.data options for the trainers' pipelines.

Every trainer gets its batches from `epoch_batches`, so all see the same global batches in the same order.
"""

from typing import Callable, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from dtensor_vs_mirrored.shared.training.batch_inputs import first, stacked, take


def epoch_order(num_examples: int, epoch: int, shuffle: bool, seed: int) -> np.ndarray:
    """Example indices in the order of one epoch: 0..N-1, or a permutation from (seed, epoch)."""
    if not shuffle:
        return np.arange(num_examples)
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


def batch_slices(num_examples: int, batch_size: int) -> List[slice]:
    """Global batches over one epoch's order; the final partial batch is kept (5000 = 39 x 128 + 8)."""
    return [slice(start, min(start + batch_size, num_examples)) for start in range(0, num_examples, batch_size)]


def epoch_batches(
    x, y: np.ndarray, batch_size: int, epoch: int = 0, shuffle: bool = False, seed: int = 0
) -> Iterator[Tuple[object, np.ndarray]]:
    """The global batches of one epoch, identical for every trainer (x: one input array, or a dict of them)."""
    order = epoch_order(len(y), epoch, shuffle, seed)
    for part in batch_slices(len(y), batch_size):
        index = order[part]
        yield take(x, index), y[index]


def example_label_counts(y: np.ndarray) -> np.ndarray:
    """Each example's count of counted labels (0 or more): 1 for a classifier, its unmasked tokens for a sequence;
    float targets: 1 (times its positions: each but the last axis)."""
    if y.dtype.kind == "f":
        return np.full(len(y), int(np.prod(y.shape[1:-1])), np.int64)
    return (y >= 0).reshape(len(y), -1).sum(1)


def batch_label_counts(y: np.ndarray, batch_size: int, epoch: int, shuffle: bool, seed: int) -> List[int]:
    """Each global batch's count of counted labels in one epoch: the divisor of its mean loss."""
    counted = example_label_counts(y)
    order = epoch_order(len(y), epoch, shuffle, seed)
    return [int(counted[order[part]].sum()) for part in batch_slices(len(y), batch_size)]


def without_autotune() -> tf.data.Options:
    """tf.data options with autotuning off, for the trainers' input pipelines.

    There is nothing to tune (slices, map, batch, shard, a fixed prefetch), and with it on,
    deleting an iterator that was not run to its end waits for the tuning thread's back-off,
    which grows with the run: once per epoch for DTensorDataset, and longest for MirroredStrategy's
    per-device iterators (mirrored_impl.inputs.pipeline_per_replica; docs/trainers.md).
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def equal_shape_runs(
    items: Iterable, shape_of: Callable, max_length: Optional[int] = None, first_alone: bool = False
) -> Iterator[list]:
    """Consecutive `items` grouped into lists whose `shape_of(item)` is equal, in order.

    max_length: no list is longer (None: unbounded). first_alone: the first item is a list
    of its own (a trainer's first call, whose time is the trace time).
    """
    run, limit = [], 1 if first_alone else max_length
    for item in items:
        if run and (len(run) == limit or shape_of(item) != shape_of(run[0])):
            yield run
            run, limit = [], max_length
        run.append(item)
    if run:
        yield run


def step_chunks(batches, first_alone: bool = False) -> Iterator[Tuple[np.ndarray, ...]]:
    """`batches` (epoch_batches' tuples, in order) grouped into runs of equal shape, each stacked.

    Yields tuples of arrays with a leading steps axis, e.g. (x [steps, B, 784], y [steps, B]):
    4,000 examples in batches of 128 give one chunk of 31 full batches and one of the last 32.
    A trainer runs a chunk in one tf.function call (a loop in the graph, one optimizer step
    per leading index), so the batches and their order are exactly epoch_batches'.
    first_alone: the first batch is a chunk of its own (its call's time is the trace time).
    """
    for run in equal_shape_runs(batches, lambda batch: first(batch[0]).shape, first_alone=first_alone):
        yield tuple(stacked(parts) for parts in zip(*run))
