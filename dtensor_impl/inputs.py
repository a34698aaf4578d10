"""Each global batch as DTensors sharded on the mesh's batch axis: the tutorial's split + `dtensor.pack`
(`--dtensor-input pack`), or `dtensor.DTensorDataset` (`dataset`); a batch that does not divide over the batch
axis is padded with zero-weight examples, which count nothing (shared/training/losses.py). For a model whose examples
are independent (ModelDefinition.independent_examples), a short batch (an epoch's last) is padded to the full batch's
shape (`pad_to`), so that it runs in the full batches' traced step: a shape of its own traced and lowered the step
again, seconds of the first epoch for a transformer. A model with batch statistics would
count the padding in them, so its short batch is padded only to divide."""

from typing import Iterator, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from dtensor_vs_mirrored.dtensor_impl.mesh import BATCH_AXIS, batch_layout
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.training import batch_inputs
from dtensor_vs_mirrored.shared.training.batches import epoch_batches, epoch_order, without_autotune
from dtensor_vs_mirrored.shared.training.data import Dataset
from dtensor_vs_mirrored.shared.training.losses import host_label_count

DATASET_PREFETCH = 2  # global batches DTensorDataset prepares ahead of the step


def padded_length(examples: int, batch_shards: int, at_least: int = 0) -> int:
    """`examples` padded to a multiple of `batch_shards`, and to at least `at_least` (then a multiple too)."""
    return -(-max(examples, at_least) // batch_shards) * batch_shards


def pad_batch(x, y: np.ndarray, batch_shards: int, at_least: int = 0):
    """(x, y, example_weights), padded with zero-weight examples to padded_length (x: each input alike)."""
    real = len(y)
    padded = padded_length(real, batch_shards, at_least)
    weights = np.zeros(padded, np.float32)
    weights[:real] = 1.0
    if padded != real:
        x = batch_inputs.each(lambda array: zero_padded(array, padded), x)
        y = zero_padded(y, padded)
    return x, y, weights


def zero_padded(array: np.ndarray, length: int) -> np.ndarray:
    return np.concatenate([array, np.zeros((length - len(array), *array.shape[1:]), array.dtype)])


def shard_to_mesh(array: np.ndarray, layout: dtensor.Layout):
    """One host array as a DTensor split on the batch axis: the tutorial's split + dtensor.pack.

    pack wants one component per device in mesh order; devices that differ only in
    their model index get the same batch shard.
    """
    shards = np.split(array, layout.mesh.dim_size(BATCH_AXIS))
    return dtensor.pack([shards[location[BATCH_AXIS]] for location in layout.mesh.local_device_locations()], layout)


def pack_batch(x: np.ndarray, y: np.ndarray, mesh: dtensor.Mesh, pad_to: int = 0):
    """A global batch as (x, y, example_weights) DTensors sharded on the batch axis, padded to divide, and to at
    least `pad_to` examples (a short batch to the full batch's shape)."""
    arrays = pad_batch(x, y, mesh.dim_size(BATCH_AXIS), pad_to)
    return tuple(
        batch_inputs.each(lambda array: shard_to_mesh(array, batch_layout(mesh, array.ndim)), part) for part in arrays
    )


def packed_batches(data: Dataset, config: Config, epoch: int, mesh: dtensor.Mesh, pad_to: int = 0) -> Iterator[Tuple]:
    for x_batch, y_batch in epoch_batches(
        data.x_train, data.y_train, config.batch_size, epoch, config.shuffle, config.seed
    ):
        yield pack_batch(x_batch, y_batch, mesh, pad_to), host_label_count(y_batch)


def dataset_batches(data: Dataset, config: Config, epoch: int, mesh: dtensor.Mesh, pad_to: int = 0) -> Iterator[Tuple]:
    """The same batches as `packed_batches`: the full ones through DTensorDataset, the remainder packed.

    DTensorDataset batches per replica with drop_remainder=True and hands replica r
    every B-th of those batches, so over whole global batches in epoch order it
    yields exactly epoch_batches' sequence.
    """
    order = epoch_order(len(data.y_train), epoch, config.shuffle, config.seed)
    full_count = len(order) // config.batch_size * config.batch_size
    if full_count:
        index = order[:full_count]
        examples = tf.data.Dataset.from_tensor_slices(  # full batches: every example weighs 1
            (batch_inputs.take(data.x_train, index), data.y_train[index], np.ones(full_count, np.float32))
        )
        examples = examples.with_options(without_autotune())
        batches = dtensor.DTensorDataset(
            examples,
            mesh=mesh,
            layouts=(
                batch_inputs.each(lambda array: batch_layout(mesh, array.ndim), data.x_train),
                batch_layout(mesh, data.y_train.ndim),
                batch_layout(mesh, 1),
            ),
            global_batch_size=config.batch_size,
            batch_dim=BATCH_AXIS,
            prefetch=DATASET_PREFETCH,
        )
        # Take exactly the full batches: running the iterator to its end raises OutOfRange on
        # the DTensor device, which poisons its executor and cancels every later op.
        iterator = iter(batches)
        for start in range(0, full_count, config.batch_size):
            yield next(iterator), host_label_count(data.y_train[index[start : start + config.batch_size]])
        del iterator  # stops its per-device input pipelines before the remainder trains
    if full_count < len(order):
        index = order[full_count:]
        yield pack_batch(batch_inputs.take(data.x_train, index), data.y_train[index], mesh, pad_to), len(index)


def check_input_mode(dtensor_input: str, mesh_device_count: int, device_type: str) -> None:
    """Raise UsageError for DTensorDataset on a mesh over part of the devices.

    DTensorDataset takes the number of devices per batch shard from all logical
    devices of the process, not from the mesh; on a smaller mesh it repeats every
    per-shard batch (8 CPUs, mesh batch=2: each global batch is two copies of one half).
    """
    process_device_count = dtensor.num_local_devices(device_type)
    if dtensor_input == "dataset" and mesh_device_count != process_device_count:
        raise UsageError(
            f"--dtensor-input dataset needs a mesh over all {process_device_count} logical "
            f"{device_type}s of this process, not {mesh_device_count} (DTensorDataset would "
            f"repeat batches); use --dtensor-input pack, or --devices {mesh_device_count} "
            f"in a new process"
        )
