"""The DTensor trainer: TensorFlow's "Distributed training with Core APIs and DTensor", made exact.

    python compare.py --trainers reference,dtensor --data embedded
    python compare.py --trainers dtensor --mesh batch=4,model=2 --dtensor-input dataset

Reads top to bottom like the tutorial: a mesh over the given devices, a
`DenseLayer(tf.Module)` whose weight and bias are `dtensor.DVariable`s with layouts
(dtensor_impl/mesh.py says which), an MLP, the shared Adam or SGD with slots that
are DVariables in their weight's layout, and `train_step` / `test_step` as
`tf.function`s (`train_steps` calls `train_step` on up to 4 batches at once). Every
global batch from `shared.data.epoch_batches` becomes DTensors sharded on the mesh's
batch axis, either by splitting it on the host and calling `dtensor.pack` (the
tutorial; `--dtensor-input pack`) or through `dtensor.DTensorDataset`
(`--dtensor-input dataset`).

With `--clients C` (shared/multiclient.py) the mesh spans the devices of C processes
(`dtensor.create_distributed_mesh`) and `pack_batch` packs only this client's shards of
each global batch; the rest is unchanged.

Where it departs from the tutorial, and why:
  * initial values come from `shared.model.initial_values` and are copied onto the
    mesh, then sliced to the weight's layout: a stateless random op run under a
    sharded layout would draw different numbers than the reference;
  * a final partial batch that does not divide over the batch axis is padded with
    zero-weight examples, and the loss is the sum over real examples divided by the
    global real count (shared.losses), so no example is dropped and nothing changes
    the mean; DTensorDataset needs drop_remainder=True, so its remainder is packed;
  * the default Adam never reads a slot after writing it in the same step (on
    DTensor that read returned stale zeros while its all-reduce combining was on;
    `--adam tutorial` keeps the tutorial's formulation so the parity check can be
    seen to catch it);
  * on CPU, DTensor's combining of all-reduces is turned off
    before DTensor starts (dtensor_impl/combining.py): ~14% faster, and no stale reads.
  * a hidden width that the model axis does not divide is padded with zero units
    (dtensor_impl/mesh.py); the history's weights and gradients, checkpoints and the
    export hold the unpadded model.

Input modes. `pack` is the default: measured on 8 logical CPUs (embedded data, batch
128) it was as fast as DTensorDataset with a batch-only mesh and ~1.7x faster with
batch=4,model=2, where DTensorDataset copies each batch shard per model device in
tf.data. DTensorDataset also needs care: it sizes its sharding from all logical
devices of the process, so it is refused on a mesh over fewer (it would repeat
batches); running its iterator to the end poisons the DTensor executor, so exactly
the full batches are taken; and tf.data autotuning is turned off for it (see
`shared.data.without_autotune`).

Costs: per step, for `pack`, one small host copy per device; one all-reduce per
gradient and Adam's update on every device, unfused (docs/throughput.md). Per call,
`train_steps` runs up to STEPS_PER_CALL steps of equal batch shape (one while DTensor's
all-reduce combining is on: `steps_per_call`), and the loop waits
for the call's last loss (one host sync per call), so that step times are true; the
other losses stay replicated DTensors until the epoch ends (EpochMeter reads them then,
~3 us each: `float()` / `.numpy()` of a replicated DTensor reads one device's copy).
Tracing: one trace per group size and batch shape (e.g. the first batch alone, 4 full
batches, the 2 left over, the last batch), all in the first epoch: every epoch is grouped
alike, so no measured epoch traces (`EpochRecord.traces` counts them).
"""
import time
from typing import Callable, Iterator, List, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from dtensor_impl import combining
from dtensor_impl.mesh import (BATCH_AXIS, MeshSpec, batch_layout, create_client_mesh, create_mesh,
                               describe_layout, layer_layouts, mesh_spec, padded_sizes)
from shared.checkpoint import TrainingState
from shared.checksums import read_state_checksums, state_checksums, state_names, state_variables
from shared.config import Config
from shared.data import MnistData, batch_slices, epoch_batches, epoch_order, equal_shape_runs, without_autotune
from shared.errors import UsageError
from shared.export import export_trainer
from shared.history import EpochMeter, History, format_epoch_line
from shared.losses import correct_count, loss_sum, mean_loss
from shared.memory import DeviceMemory, located_bytes, tally
from shared.model import MLP, build_model_and_optimizer, initial_values, layer_sizes
from shared.optim import make_optimizer

INPUT_MODES = ("pack", "dataset")
# Steps per train_steps call. Measured on a pre-packed batch, alternating in one process: a
# step took 8.2 ms in one call per step and 6.9 ms in calls of 4 at 2 devices (27.3 and
# 25.5 ms at 8); calls of 8 gained ~0.2 ms more but doubled the trace time (3.3 s at 8).
STEPS_PER_CALL = 4
DATASET_PREFETCH = 2  # global batches DTensorDataset prepares ahead of the step
COMBINE_ALL_REDUCES = combining.VARIABLE


def steps_per_call(device_type: str) -> int:
    """STEPS_PER_CALL while DTensor's all-reduce combining is off in this process, else 1.

    With the combining on (TensorFlow's default, kept on GPUs), a DVariable read after an
    assign in the same tf.function returns the value from before the assign: in a call of
    several steps, every step after the first would read the weights and slots from before
    the previous step's update (measured on 8 CPUs with the combining on: the fixed Adam's
    loss 0.79 off the reference's, from step 2; one step per call matched to 2.4e-7).
    """
    return 1 if combining.settle(device_type) else STEPS_PER_CALL


# --- the model -----------------------------------------------------------------------------

def on_mesh(value: np.ndarray, layout: dtensor.Layout):
    """`value` copied whole to every device, then sliced to `layout`: the same numbers for any layout."""
    replicated = dtensor.copy_to_mesh(tf.constant(value), dtensor.Layout.replicated(layout.mesh, layout.rank))
    return dtensor.relayout(replicated, layout)


def to_numpy(tensor) -> np.ndarray:
    """A DTensor (or DVariable) as one array; a sharded one is all-gathered first.

    `.numpy()` works on a replicated DTensor and reads one device's copy; DTensor
    refuses it for a sharded one.
    """
    tensor = tf.convert_to_tensor(tensor)
    layout = dtensor.fetch_layout(tensor)
    return dtensor.relayout(tensor, dtensor.Layout.replicated(layout.mesh, layout.rank)).numpy()


class DenseLayer(tf.Module):
    """y = activation(x @ w + b) with w and b DVariables laid out on the mesh."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray, weight_layout: dtensor.Layout,
                 bias_layout: dtensor.Layout, activation: Callable = tf.identity):
        super().__init__()
        self.w = dtensor.DVariable(on_mesh(weight, weight_layout), name="w")
        self.b = dtensor.DVariable(on_mesh(bias, bias_layout), name="b")
        self.activation = activation

    def __call__(self, x):
        return self.activation(tf.matmul(x, self.w) + self.b)


def build_model(values: Sequence[np.ndarray], mesh: dtensor.Mesh) -> MLP:
    """The shared MLP (ReLU between layers, logits out) over DenseLayers holding `values` ([w0, b0, ...])."""
    count = len(values) // 2
    layouts = layer_layouts(mesh, count)
    return MLP([DenseLayer(values[2 * i], values[2 * i + 1], *layouts[i],
                           activation=tf.nn.relu if i < count - 1 else tf.identity)
                for i in range(count)])


def build_optimizer(config: Config, model: MLP, mesh: dtensor.Mesh):
    """The shared Adam/SGD; Adam's m and v slots take their weight's layout, the step is replicated."""
    return make_optimizer(
        config.optimizer, config.adam, model.weights, config.learning_rate,
        zeros_like=lambda var: dtensor.DVariable(
            dtensor.call_with_layout(tf.zeros, var.layout, shape=var.shape, dtype=var.dtype)),
        make_step=lambda: dtensor.DVariable(
            dtensor.call_with_layout(tf.zeros, dtensor.Layout.replicated(mesh, 0), shape=(), dtype=tf.int64)))


def pad_values(values: Sequence[np.ndarray], padded: Sequence[int]) -> List[np.ndarray]:
    """[w0, b0, w1, b1, ...] zero-padded to the layer sizes `padded` (mesh.padded_sizes): a padded
    width gets zero output columns in its weight, zero bias entries and zero input rows in the
    next weight, so its units compute 0 and stay 0 (dtensor_impl/mesh.py)."""
    result = []
    for i, (weight, bias) in enumerate(zip(values[0::2], values[1::2])):
        rows, columns = padded[i], padded[i + 1]
        result += [np.pad(weight, ((0, rows - weight.shape[0]), (0, columns - weight.shape[1]))),
                   np.pad(bias, (0, columns - bias.shape[0]))]
    return result


def unpadded(arrays: Sequence[np.ndarray], sizes: Sequence[int]) -> List[np.ndarray]:
    """[w0, b0, ...] (weights or gradients) of the padded model cut back to the layer sizes `sizes`."""
    return [array[:sizes[i // 2], :sizes[i // 2 + 1]] if array.ndim == 2 else array[:sizes[i // 2 + 1]]
            for i, array in enumerate(arrays)]


def copy_to_host(model: MLP, optimizer, host_model: MLP, host_optimizer) -> None:
    """The padded mesh model's weights and optimizer state into the unpadded host copy (cut to its shapes).

    tf.Module lists an optimizer's variables in attribute order, the same for both copies.
    """
    for source, target in zip([*model.weights, *optimizer.variables],
                              [*host_model.weights, *host_optimizer.variables], strict=True):
        target.assign(to_numpy(source)[tuple(slice(0, size) for size in target.shape)])


def copy_from_host(host_model: MLP, host_optimizer, model: MLP, optimizer) -> None:
    """The unpadded host copy (e.g. just restored) into the padded mesh model, zero-padded to its shapes."""
    for source, target in zip([*host_model.weights, *host_optimizer.variables],
                              [*model.weights, *optimizer.variables], strict=True):
        value = source.numpy()
        if value.ndim:  # not the scalar step count
            value = np.pad(value, [(0, size - have) for size, have in zip(target.shape, value.shape)])
        target.assign(on_mesh(value, target.layout))


def memory_per_device(model: MLP, optimizer) -> List[DeviceMemory]:
    """Bytes of weights and optimizer state on each mesh device, from every DVariable's per-device
    components (padding included: it is held)."""
    def components(variables):
        return located_bytes(component for variable in variables
                             for component in dtensor.unpack(variable.read_value()))
    return tally(components(model.weights), components(optimizer.variables))


# --- the input ------------------------------------------------------------------------------

def pad_batch(x: np.ndarray, y: np.ndarray, batch_shards: int):
    """(x, y, example_weights), padded with zero-weight examples to a multiple of `batch_shards`."""
    real = len(y)
    padded = -(-real // batch_shards) * batch_shards
    weights = np.zeros(padded, np.float32)
    weights[:real] = 1.0
    if padded != real:
        x = np.concatenate([x, np.zeros((padded - real, *x.shape[1:]), x.dtype)])
        y = np.concatenate([y, np.zeros(padded - real, y.dtype)])
    return x, y, weights


def shard_to_mesh(array: np.ndarray, layout: dtensor.Layout):
    """One host array as a DTensor split on the batch axis: the tutorial's split + dtensor.pack.

    pack wants one component per device in mesh order; devices that differ only in
    their model index get the same batch shard.
    """
    shards = np.split(array, layout.mesh.dim_size(BATCH_AXIS))
    return dtensor.pack([shards[location[BATCH_AXIS]] for location in layout.mesh.local_device_locations()],
                        layout)


def pack_batch(x: np.ndarray, y: np.ndarray, mesh: dtensor.Mesh):
    """A global batch as (x, y, example_weights) DTensors sharded on the batch axis, padded to divide."""
    arrays = pad_batch(x, y, mesh.dim_size(BATCH_AXIS))
    return tuple(shard_to_mesh(array, batch_layout(mesh, array.ndim)) for array in arrays)


def packed_batches(data: MnistData, config: Config, epoch: int, mesh: dtensor.Mesh) -> Iterator[Tuple]:
    for x_batch, y_batch in epoch_batches(data.x_train, data.y_train, config.batch_size, epoch,
                                          config.shuffle, config.seed):
        yield pack_batch(x_batch, y_batch, mesh), len(y_batch)


def dataset_batches(data: MnistData, config: Config, epoch: int, mesh: dtensor.Mesh) -> Iterator[Tuple]:
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
            (data.x_train[index], data.y_train[index], np.ones(full_count, np.float32)))
        examples = examples.with_options(without_autotune())
        batches = dtensor.DTensorDataset(
            examples, mesh=mesh, layouts=(batch_layout(mesh, 2), batch_layout(mesh, 1), batch_layout(mesh, 1)),
            global_batch_size=config.batch_size, batch_dim=BATCH_AXIS, prefetch=DATASET_PREFETCH)
        # Take exactly the full batches: running the iterator to its end raises OutOfRange on
        # the DTensor device, which poisons its executor and cancels every later op.
        iterator = iter(batches)
        for _ in range(full_count // config.batch_size):
            yield next(iterator), config.batch_size
        del iterator  # stops its per-device input pipelines before the remainder trains
    if full_count < len(order):
        index = order[full_count:]
        yield pack_batch(data.x_train[index], data.y_train[index], mesh), len(index)


# --- the steps ------------------------------------------------------------------------------

@tf.function
def compute_gradients(model, x, y, example_weights):
    with tf.GradientTape() as tape:
        loss = mean_loss(model(x), y, tf.reduce_sum(example_weights), example_weights)
    return tape.gradient(loss, model.weights)


@tf.function
def train_step(model, optimizer, x, y, example_weights):
    """One optimizer step on a global batch; returns (mean loss, correct count) before the update.

    The real-example count is summed from the weights on the devices, so it is global
    and the padded last batch needs no second input.
    """
    with tf.GradientTape() as tape:
        logits = model(x)
        loss = mean_loss(logits, y, tf.reduce_sum(example_weights), example_weights)
    grads = tape.gradient(loss, model.weights)
    optimizer.apply_gradients(grads, model.weights)
    return loss, correct_count(logits, y, example_weights)


@tf.function
def train_steps(model, optimizer, batches, record_state: bool = False):
    """`train_step` on each packed (x, y, example_weights) of `batches` in turn, in one call.

    The Python loop unrolls when traced: one graph of len(batches) steps, so one dispatch
    instead of several. Returns ([mean losses], [correct counts], [state checksums]), one
    per step; the checksums (at each step's start) only with `record_state`, else [].
    """
    losses, corrects, checksums = [], [], []
    for batch in batches:
        if record_state:
            checksums.append(state_checksums(state_variables(model, optimizer)))
        loss, correct = train_step(model, optimizer, *batch)
        losses.append(loss)
        corrects.append(correct)
    return losses, corrects, checksums


@tf.function
def test_step(model, x, y, example_weights):
    logits = model(x)
    return loss_sum(logits, y, example_weights), correct_count(logits, y, example_weights)


def evaluate(model, x, y, batch_size: int, mesh: dtensor.Mesh):
    """(mean loss, accuracy) over a whole split; one host sync at the end."""
    results = [test_step(model, *pack_batch(x_batch, y_batch, mesh))
               for x_batch, y_batch in epoch_batches(x, y, batch_size)]
    total_loss = sum(float(batch_loss) for batch_loss, _ in results)  # host sync point
    total_correct = sum(float(batch_correct) for _, batch_correct in results)
    return total_loss / len(y), total_correct / len(y)


def predict_logits(model, x: np.ndarray, mesh: dtensor.Mesh) -> np.ndarray:
    """Logits for host images, computed on the mesh: what --export checks its SavedModel against."""
    images, _, _ = pack_batch(x, np.zeros(len(x), np.int64), mesh)
    return to_numpy(model(images))[:len(x)]


# --- the loop -------------------------------------------------------------------------------

def check_input_mode(dtensor_input: str, mesh_device_count: int, device_type: str) -> None:
    """Raise UsageError for an unknown mode, or DTensorDataset on a mesh over part of the devices.

    DTensorDataset takes the number of devices per batch shard from all logical
    devices of the process, not from the mesh; on a smaller mesh it repeats every
    per-shard batch (8 CPUs, mesh batch=2: each global batch is two copies of one half).
    """
    if dtensor_input not in INPUT_MODES:
        raise UsageError(f"--dtensor-input {dtensor_input!r} is unknown; use pack or dataset")
    process_device_count = dtensor.num_local_devices(device_type)
    if dtensor_input == "dataset" and mesh_device_count != process_device_count:
        raise UsageError(f"--dtensor-input dataset needs a mesh over all {process_device_count} logical "
                         f"{device_type}s of this process, not {mesh_device_count} (DTensorDataset would "
                         f"repeat batches); use --dtensor-input pack, or --devices {mesh_device_count} "
                         f"in a new process")


def check_config(config: Config, devices: Sequence[str]) -> MeshSpec:
    """The mesh and input-mode checks, run before anything trains (compare.py runs them up front)."""
    # --clients: `devices` are this client's; the mesh spans every client's (shared/multiclient.py).
    spec = mesh_spec(config.mesh, len(devices) * config.clients, config.batch_size)
    if config.clients > 1 and config.dtensor_input != "pack":
        raise UsageError(f"--dtensor-input {config.dtensor_input} is not supported with --clients "
                         f"{config.clients}; use --dtensor-input pack (each client packs its own shards)")
    check_input_mode(config.dtensor_input, len(devices), devices[0].split(":")[0])
    check_float64_collectives(config.dtype, spec)
    return spec


FLOAT64_ALL_REDUCE_SINCE = (2, 13)  # measured: 2.12.1 fails, 2.13.1 to 2.21.0 pass (docs/releases.md)
FLOAT64_ALL_GATHER_SINCE = (2, 14)  # measured: 2.13.1 fails, 2.14.1 to 2.21.0 pass


def tensorflow_release() -> Tuple[int, int]:
    return tuple(int(part) for part in tf.__version__.split(".")[:2])


def float64_collectives_since(spec: MeshSpec) -> Tuple[int, int]:
    """The oldest release whose DTensor collectives carry float64 on this mesh. 2.12's all-reduce
    has none ("'tf.DTensorAllReduce' op operand #0 must be tensor of bfloat16 or ... 64-bit integer
    ... values, but got 'tensor<784x64xf64>'"), and every mesh of more than one device all-reduces;
    2.13's all-gather has none, and a model axis all-gathers."""
    if (spec.model or 1) > 1:
        return FLOAT64_ALL_GATHER_SINCE
    return FLOAT64_ALL_REDUCE_SINCE if spec.device_count > 1 else (0, 0)


def check_float64_collectives(dtype: str, spec: MeshSpec) -> None:
    """One line instead of DTensor's MLIR error when this release cannot run float64 on this mesh."""
    needed = float64_collectives_since(spec)
    if dtype == "float64" and tensorflow_release() < needed:
        raise UsageError(f"--dtype float64 on DTensor mesh {spec} needs TensorFlow "
                         f"{'.'.join(map(str, needed))} or later (this is {tf.__version__}: its DTensor "
                         f"collectives have no float64); use --dtype float32 or a newer TensorFlow")


def fit(config: Config, data: MnistData, devices: Sequence[str], log: Callable = print) -> History:
    """Train on a mesh over exactly `devices` and return the shared history record."""
    spec = check_config(config, devices)
    device_type = devices[0].split(":")[0]
    combining.settle(device_type)  # before anything starts DTensor in this process
    if config.clients > 1:  # multi-client: pack_batch then packs only this client's shards
        mesh = create_client_mesh(spec, device_type)
        placement = f"mesh {spec} over {config.clients} clients x {len(devices)} {device_type}"
    else:
        mesh = create_mesh(spec, devices)
        placement = f"mesh {spec} over {len(devices)} x {device_type}"
    history = History(trainer="dtensor", placement=placement, dtype=config.dtype)

    sizes = layer_sizes(config.hidden)
    padded = padded_sizes(sizes, spec)  # a width the model axis does not divide gets zero units
    model = build_model(pad_values(initial_values(sizes, config.seed, config.dtype), padded), mesh)
    optimizer = build_optimizer(config, model, mesh)
    record_state = config.dtype == "float64"  # per-step state checksums: what parity names when it fails
    history.state_names = state_names(model, optimizer) if record_state else []
    # Checkpoints hold the unpadded model, so any trainer and mesh restores them: with padding, an
    # unpadded copy on the host is what they read and write (one all-gather per save).
    state_model, state_optimizer = model, optimizer
    if padded != sizes:
        with tf.device("CPU:0"):
            state_model, state_optimizer = build_model_and_optimizer(config)
    state = TrainingState("dtensor", config, state_model, state_optimizer, len(data.y_train), log)
    start_epoch = state.restore()  # --restore: epochs already trained; 0 without; relayouts any checkpoint
    if start_epoch and state_model is not model:
        copy_from_host(state_model, state_optimizer, model, optimizer)
    layouts = " ".join(f"{name}{i}{describe_layout(var.layout)}"
                       for i, layer in enumerate(model.layers) for name, var in (("w", layer.w), ("b", layer.b)))
    history.details = {"mesh": str(spec), "dtensor_input": config.dtensor_input, "layouts": layouts}
    if padded != sizes:
        history.details["padding"] = ", ".join(f"hidden {size} -> {padded_size}" for size, padded_size
                                               in zip(sizes[1:-1], padded[1:-1]) if size != padded_size)
    if not config.quiet:
        log(f"{'dtensor':<10} {history.placement}; input {config.dtensor_input}; layouts {layouts}"
            + (f"; padded with zero units: {history.details['padding']}" if padded != sizes else ""))

    first_x, first_y = next(epoch_batches(data.x_train, data.y_train, config.batch_size, start_epoch,
                                          config.shuffle, config.seed))
    history.first_step_gradients = unpadded([to_numpy(g) for g in
                                             compute_gradients(model, *pack_batch(first_x, first_y, mesh))], sizes)

    batches = packed_batches if config.dtensor_input == "pack" else dataset_batches
    for epoch in range(start_epoch, config.epochs):
        meter = EpochMeter(f"dtensor epoch {epoch + 1}/{config.epochs}",
                           len(batch_slices(len(data.y_train), config.batch_size)))
        # The first call of the run takes one step: its time is the trace time plus one step's, as
        # for the other trainers. Every epoch is grouped alike, so every call shape is traced in the
        # first epoch and none in a measured one (a new group size would cost a trace, ~1 s).
        groups = equal_shape_runs(batches(data, config, epoch, mesh), lambda item: item[0][0].shape,
                                  steps_per_call(device_type), first_alone=True)
        traces_before = train_steps.experimental_get_tracing_count()
        for call, group in enumerate(groups):
            started = time.perf_counter()
            losses, corrects, checksums = train_steps(model, optimizer, [batch for batch, _ in group], record_state)
            # Wait for the call's last step: a call of several steps can return before they have
            # run, and the step times would then be dispatch times (measured: ~3% of throughput).
            float(losses[-1])
            if epoch == start_epoch and call == 0:
                history.trace_seconds = time.perf_counter() - started  # the first call's: tracing included
            meter.add_steps(losses, corrects, [real_count for _, real_count in group],
                            checksums if record_state else None)
        finished = meter.finish()  # before evaluating: the epoch's time is training only
        traces = train_steps.experimental_get_tracing_count() - traces_before
        test_loss, test_accuracy = evaluate(model, data.x_test, data.y_test, config.batch_size, mesh)
        record = history.add_epoch(epoch + 1, meter, finished, test_loss, test_accuracy, traces)
        if not config.quiet:
            log(format_epoch_line("dtensor", record, config.epochs))
        if config.checkpoint_dir and state_model is not model:
            copy_to_host(model, optimizer, state_model, state_optimizer)
        state.save_epoch(epoch + 1)  # --checkpoint-dir
    if record_state:  # padded units are zero: they add nothing to a checksum
        history.add_final_state(read_state_checksums(state_variables(model, optimizer)))
    history.final_weights = unpadded([to_numpy(w) for w in model.weights], sizes)  # an all-gather per sharded one
    history.memory_per_device = memory_per_device(model, optimizer)
    export_trainer(config, "dtensor", history.final_weights, lambda x: predict_logits(model, x, mesh),  # --export
                   data.x_test, history.details)
    return history
