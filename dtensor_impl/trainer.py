"""The DTensor trainer: TensorFlow's "Distributed training with Core APIs and DTensor", made exact.

    python compare.py --trainers reference,dtensor --data embedded
    python compare.py --trainers dtensor --mesh batch=4,model=2 --dtensor-input dataset

Top to bottom like the tutorial: a mesh over the devices, the model's variables as
`dtensor.DVariable`s in their layouts (the model says which dimension the `model` axis splits;
a width it does not divide gets zero units where the model allows), the shared Adam or SGD with
slots in their weight's layout, and `train_step` / `test_step` as tf.functions, up to
STEPS_PER_CALL steps per call. Each global batch becomes DTensors sharded on the batch axis:
split + `dtensor.pack` (`--dtensor-input pack`, the tutorial's) or `dtensor.DTensorDataset`.
Where it departs from the tutorial, and what each choice costs: docs/trainers.md.
"""

from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from dtensor_impl import combining, gathering, nccl
from dtensor_impl.layouts import LayoutPlan, plan_layouts
from dtensor_impl.mesh import (
    BATCH_AXIS,
    MeshSpec,
    batch_layout,
    create_client_mesh,
    create_mesh,
    every_mesh,
    mesh_spec,
    parse_mesh,
)
from dtensor_impl.traffic import dtensor_traffic
from shared.config import Config
from shared.console import status
from shared.errors import UsageError
from shared.measure import profile
from shared.measure.checksums import state_checksums, state_variables
from shared.measure.history import History
from shared.measure.memory import located_bytes, short_device, tally
from shared.measure.taps import Taps
from shared.model.definition import MODEL_AXIS, UNSHARDED, Model
from shared.model.registry import definition_for
from shared.training import loop
from shared.training.batches import epoch_batches, epoch_order, equal_shape_runs, without_autotune
from shared.training.build import build_model_and_optimizer
from shared.training.data import Dataset
from shared.training.losses import correct_count, host_label_count, label_count, loss_sum, mean_loss
from shared.training.optim import dense, make_optimizer
from shared.training.protocol import ClusterRole, RunFacts, Trainer, Variant

# Steps per train_steps call. Measured on a pre-packed batch, alternating in one process: a
# step took 8.2 ms in one call per step and 6.9 ms in calls of 4 at 2 devices (27.3 and
# 25.5 ms at 8); calls of 8 gained ~0.2 ms more but doubled the trace time (3.3 s at 8).
STEPS_PER_CALL = 4
UNROLL_MAX_OPERATIONS = 1000  # see steps_per_call
DATASET_PREFETCH = 2  # global batches DTensorDataset prepares ahead of the step
COMBINE_ALL_REDUCES = combining.VARIABLE


def steps_per_call(device_type: str, step_operations: int = 0) -> int:
    """STEPS_PER_CALL while DTensor's all-reduce combining is off in this process and one step's graph
    has at most UNROLL_MAX_OPERATIONS operations, else 1.

    Tracing grows with the unrolled graph: the ViT's one-step call traced in 11.5 s on 8 CPUs and its
    3-step call in ~57 s, for no gain (a step takes ~350 ms, where a dispatch saved is ~1 ms); the
    MLP's 4-step call traces in ~3 s and saves 16% a step (STEPS_PER_CALL).

    With the combining on (TensorFlow's default, kept on GPUs), a DVariable read after an
    assign in the same tf.function returns the value from before the assign: in a call of
    several steps, every step after the first would read the weights and slots from before
    the previous step's update (measured on 8 CPUs with the combining on: the fixed Adam's
    loss 0.79 off the reference's, from step 2; one step per call matched to 2.4e-7).
    """
    if combining.settle(device_type) or step_operations > UNROLL_MAX_OPERATIONS:
        return 1
    return STEPS_PER_CALL


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


def build_model(
    definition,
    values: Sequence[np.ndarray],
    mesh: dtensor.Mesh,
    plan: Optional[LayoutPlan] = None,
    gather: bool = False,
    seed: int = 0,
) -> Model:
    """The model's variables as DVariables holding `values`, each in its planned layout on `mesh`.

    A weight split on the batch axis is left to DTensor's SPMD expansion, which for the MLP moves activations
    as well as weights (all-to-alls of the inputs beside the all-gathers; batch=8: 3.9 MB a step, 6.6 MB
    with TensorFlow's lowering of an all-gather, gathering.py).
    With `gather` the forward all-gathers each such weight where it reads it, as FSDP does (its gradient is
    relayed back; 12.2 MB a step with TensorFlow's lowering, which all-reduces both); it is the
    fallback for a model DTensor cannot expand otherwise (the ViT: "EmitAllScatter was passed a
    desired_layout ... not more sharded than the original_layout")."""
    if plan is None:  # the model's own layouts on this mesh
        model_axis = mesh.dim_size(MODEL_AXIS) if MODEL_AXIS in mesh.dim_names else None
        plan = plan_layouts(definition, mesh.dim_size(BATCH_AXIS), model_axis)
    layouts = {
        variable.name: dtensor.Layout(list(spec), mesh) for variable, spec in zip(definition.variables, plan.specs)
    }
    gathered = {
        variable.name: dtensor.Layout([UNSHARDED if axis == BATCH_AXIS else axis for axis in spec], mesh)
        for variable, spec in zip(definition.variables, plan.specs)
        if gather and BATCH_AXIS in spec
    }

    def all_gathered(weight, variable):
        return dtensor.relayout(weight, gathered[variable.name]) if variable.name in gathered else weight

    return Model(
        definition,
        values,
        lambda value, variable: dtensor.DVariable(on_mesh(value, layouts[variable.name]), trainable=variable.trainable),
        all_gathered if gathered else None,
        seed,
    )


def build_optimizer(config: Config, model: Model, mesh: dtensor.Mesh):
    """The shared Adam/SGD; Adam's m and v slots take their weight's layout, the step is replicated."""
    return make_optimizer(
        config.optimizer,
        config.adam,
        model.trainable,
        config.learning_rate,
        zeros_like=lambda var: dtensor.DVariable(
            dtensor.call_with_layout(tf.zeros, var.layout, shape=var.shape, dtype=var.dtype)
        ),
        make_step=lambda: dtensor.DVariable(
            dtensor.call_with_layout(tf.zeros, dtensor.Layout.replicated(mesh, 0), shape=(), dtype=tf.int64)
        ),
    )


def copy_to_host(model: Model, optimizer, host_model: Model, host_optimizer) -> None:
    """The padded mesh model's weights and optimizer state into the unpadded host copy (cut to its shapes).

    tf.Module lists an optimizer's variables in attribute order, the same for both copies.
    """
    for source, target in zip(
        [*model.weights, *optimizer.variables], [*host_model.weights, *host_optimizer.variables], strict=True
    ):
        target.assign(to_numpy(source)[tuple(slice(0, size) for size in target.shape)])


def copy_from_host(host_model: Model, host_optimizer, model: Model, optimizer) -> None:
    """The unpadded host copy (e.g. just restored) into the padded mesh model, zero-padded to its shapes."""
    for source, target in zip(
        [*host_model.weights, *host_optimizer.variables], [*model.weights, *optimizer.variables], strict=True
    ):
        value = source.numpy()
        if value.ndim:  # not the scalar step count
            value = np.pad(value, [(0, size - have) for size, have in zip(target.shape, value.shape)])
        target.assign(on_mesh(value, target.layout))


def memory_per_device(model: Model, optimizer):
    """Bytes of weights and optimizer state on each mesh device, from every DVariable's per-device
    components (padding included: it is held)."""

    def components(variables):
        return located_bytes(component for variable in variables for component in dtensor.unpack(variable.read_value()))

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
        y = np.concatenate([y, np.zeros((padded - real, *y.shape[1:]), y.dtype)])
    return x, y, weights


def shard_to_mesh(array: np.ndarray, layout: dtensor.Layout):
    """One host array as a DTensor split on the batch axis: the tutorial's split + dtensor.pack.

    pack wants one component per device in mesh order; devices that differ only in
    their model index get the same batch shard.
    """
    shards = np.split(array, layout.mesh.dim_size(BATCH_AXIS))
    return dtensor.pack([shards[location[BATCH_AXIS]] for location in layout.mesh.local_device_locations()], layout)


def pack_batch(x: np.ndarray, y: np.ndarray, mesh: dtensor.Mesh):
    """A global batch as (x, y, example_weights) DTensors sharded on the batch axis, padded to divide."""
    arrays = pad_batch(x, y, mesh.dim_size(BATCH_AXIS))
    return tuple(shard_to_mesh(array, batch_layout(mesh, array.ndim)) for array in arrays)


def packed_batches(data: Dataset, config: Config, epoch: int, mesh: dtensor.Mesh) -> Iterator[Tuple]:
    for x_batch, y_batch in epoch_batches(
        data.x_train, data.y_train, config.batch_size, epoch, config.shuffle, config.seed
    ):
        yield pack_batch(x_batch, y_batch, mesh), host_label_count(y_batch)


def dataset_batches(data: Dataset, config: Config, epoch: int, mesh: dtensor.Mesh) -> Iterator[Tuple]:
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
            (data.x_train[index], data.y_train[index], np.ones(full_count, np.float32))
        )
        examples = examples.with_options(without_autotune())
        batches = dtensor.DTensorDataset(
            examples,
            mesh=mesh,
            layouts=(
                batch_layout(mesh, data.x_train.ndim),
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
        yield pack_batch(data.x_train[index], data.y_train[index], mesh), len(index)


# --- the steps ------------------------------------------------------------------------------


def training_context(model, optimizer, x, record: bool = False):
    """The forward's context in a step: x is the global batch in DTensor's global view (its padding examples last)."""
    return model.training_context(optimizer.step, tf.range(x.shape[0], dtype=tf.int64), record)


def into_layout(value, variable):
    """A running statistic's new value in its variable's layout (DTensor assigns only a value of the same)."""
    return dtensor.relayout(tf.cast(value, variable.dtype), variable.layout)


@tf.function
def compute_gradients(model, optimizer, x, y, example_weights):
    with tf.GradientTape() as tape:
        logits = model(x, training_context(model, optimizer, x))
        loss = mean_loss(logits, y, label_count(y, example_weights), example_weights, model.definition.loss)
    return dense(tape.gradient(loss, model.trainable))


def record_taps(model, optimizer, x, y, example_weights, real: int) -> Taps:
    """The forward's tapped values and their gradients at the current state (no update), all-gathered, the
    padding examples cut."""
    names = []

    @tf.function
    def record():
        context = training_context(model, optimizer, x, record=True)
        with tf.GradientTape() as tape:
            logits = model(x, context)
            loss = mean_loss(logits, y, label_count(y, example_weights), example_weights, model.definition.loss)
        names.extend(name for name, _ in context.taps)
        values = [value for _, value in context.taps]
        return values, tape.gradient(loss, values)

    values, gradients = record()
    return Taps(
        names,
        [to_numpy(value)[:real] for value in values],
        [None if gradient is None else to_numpy(gradient)[:real] for gradient in gradients],
    )


@tf.function
def train_step(model, optimizer, x, y, example_weights):
    """One optimizer step on a global batch; returns (mean loss, correct count) before the update.

    The real-example count is summed from the weights on the devices, so it is global
    and the padded last batch needs no second input.
    """
    context = training_context(model, optimizer, x)
    with tf.GradientTape() as tape:
        with tf.name_scope(profile.FORWARD_SCOPE):  # the scopes name the step's parts for --profile
            logits = model(x, context)
            loss = mean_loss(logits, y, label_count(y, example_weights), example_weights, model.definition.loss)
    grads = dense(tape.gradient(loss, model.trainable))
    with tf.name_scope(profile.UPDATE_SCOPE):
        model.apply_updates(context, into_layout)  # running statistics: once, from the global batch
        optimizer.apply_gradients(grads, model.trainable)
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
def forward(model, x):
    """The model on the mesh in a traced function: eagerly, an op between a DTensor and a constant the forward
    makes (the GPT's causal mask) is refused."""
    return model(x)


@tf.function
def test_step(model, x, y, example_weights):
    logits = model(x)
    return loss_sum(logits, y, example_weights, model.definition.loss), correct_count(logits, y, example_weights)


# --- the loop -------------------------------------------------------------------------------


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


def check_config(config: Config, devices: Sequence[str]) -> MeshSpec:
    """The mesh and input-mode checks, run before anything trains (compare.py runs them up front)."""
    # --clients: `devices` are this client's; the mesh spans every client's (shared/run/clients.py).
    spec = mesh_spec(config.mesh, len(devices) * config.clients, config.batch_size)
    check_input_mode(config.dtensor_input, len(devices), devices[0].split(":")[0])
    check_float64_collectives(config.dtype, spec, config.shard_weights)
    if config.shard_weights and spec.batch == 1:
        raise UsageError(
            f"--shard-weights splits weights over the batch axis, and mesh {spec} has a batch axis of 1; "
            f"use a mesh with batch > 1, e.g. batch={spec.device_count}, or drop --shard-weights"
        )
    layout_plan(config, spec)  # a width an axis cannot split, and no padding: one line
    return spec


def layout_plan(config: Config, spec: MeshSpec) -> LayoutPlan:
    return plan_layouts(definition_for(config), spec.batch, spec.model, config.shard_weights)


FLOAT64_ALL_REDUCE_SINCE = (2, 13)  # measured: 2.12.1 fails, 2.13.1 to 2.21.0 pass (docs/releases.md)
FLOAT64_ALL_GATHER_SINCE = (2, 14)  # measured: 2.13.1 fails, 2.14.1 to 2.21.0 pass


def tensorflow_release() -> Tuple[int, int]:
    return tuple(int(part) for part in tf.__version__.split(".")[:2])


def float64_collectives_since(spec: MeshSpec, shard_weights: bool = False) -> Tuple[int, int]:
    """The oldest release whose DTensor collectives carry float64 on this mesh. 2.12's all-reduce
    has none ("'tf.DTensorAllReduce' op operand #0 must be tensor of bfloat16 or ... 64-bit integer
    ... values, but got 'tensor<784x64xf64>'"), and every mesh of more than one device all-reduces;
    2.13's all-gather has none, and a model axis (or weights split on the batch axis) all-gathers."""
    if (spec.model or 1) > 1 or (shard_weights and spec.batch > 1):
        return FLOAT64_ALL_GATHER_SINCE
    return FLOAT64_ALL_REDUCE_SINCE if spec.device_count > 1 else (0, 0)


def check_float64_collectives(dtype: str, spec: MeshSpec, shard_weights: bool = False) -> None:
    """One line instead of DTensor's MLIR error when this release cannot run float64 on this mesh."""
    needed = float64_collectives_since(spec, shard_weights)
    if dtype == "float64" and tensorflow_release() < needed:
        raise UsageError(
            f"--dtype float64 on DTensor mesh {spec} needs TensorFlow "
            f"{'.'.join(map(str, needed))} or later (this is {tf.__version__}: its DTensor "
            f"collectives have no float64); use --dtype float32 or a newer TensorFlow"
        )


def before_runtime(config: Config, device_count: int) -> None:
    """What must be fixed before TensorFlow's runtime starts in this process: DTensor's NCCL (nccl.py)."""
    nccl.settle(config.device_type, device_count, config.dtensor_nccl)


class DTensorTrainer(Trainer):
    """The parts shared.training.loop.fit calls, on a mesh over exactly `devices` (every client's with --clients)."""

    name = "dtensor"

    def __init__(self, config: Config, data: Dataset, devices: Sequence[str], log: Callable = print, gather=None):
        """`gather`: the forward all-gathers the weights split on the batch axis (True), or leaves them to
        DTensor's expansion (False); None tries DTensor's first (build_model)."""
        spec = check_config(config, devices)
        self.config, self.data, self.spec = config, data, spec
        self.device_type = devices[0].split(":")[0]
        combining.settle(self.device_type)  # before anything starts DTensor in this process
        self.collectives = nccl.settle(self.device_type, len(devices), config.dtensor_nccl)  # compare.py's came first
        self.all_gather = gathering.settle(self.device_type, spec.model or 1)  # before DTensor lowers this mesh's
        if config.clients > 1:  # multi-client: pack_batch then packs only this client's shards
            self.mesh = create_client_mesh(spec, self.device_type)
            self.placement = f"mesh {spec} over {config.clients} clients x {len(devices)} {self.device_type}"
        else:
            self.mesh = create_mesh(spec, devices)
            self.placement = f"mesh {spec} over {len(devices)} x {self.device_type}"
        if config.shard_weights:
            self.placement += ", sharded"
        self.definition = definition_for(config)
        status(f"dtensor on {self.placement}: placing the variables")
        self.plan = plan = layout_plan(config, spec)  # a width an axis does not divide gets zero units
        values = self.definition.pad(self.definition.initial_values(config.seed, config.dtype), plan.sizes)
        self.model = build_model(self.definition, values, self.mesh, plan, seed=config.seed)
        self.optimizer = build_optimizer(config, self.model, self.mesh)
        self.gathered = ""  # why the forward all-gathers the weights split on the batch axis; "" when it does not
        if any(BATCH_AXIS in spec for spec in plan.specs):
            status(f"dtensor on {self.placement}: tracing a step with the weights split on the batch axis")
            self.gathered = "asked for" if gather else "" if gather is False else self.expansion_failure(values)
            if self.gathered:
                self.model = build_model(self.definition, values, self.mesh, plan, gather=True, seed=config.seed)
                self.optimizer = build_optimizer(config, self.model, self.mesh)
        self.steps_per_call = None  # decided by the first call's graph (steps_per_call)
        # Checkpoints hold the unpadded model, so any trainer and mesh restores them: with padding, an
        # unpadded copy on the host is what they read and write (one all-gather per save).
        self.checkpointed = (self.model, self.optimizer)
        padding = [
            f"{name} {size} -> {plan.sizes[name]}"
            for name, size in self.definition.sizes.items()
            if plan.sizes[name] != size
        ]
        if padding:
            with tf.device("CPU:0"):
                self.checkpointed = build_model_and_optimizer(config)
        layouts = plan.describe(self.definition)
        self.details = {
            "mesh": str(spec),
            "dtensor_input": config.dtensor_input,
            "layouts": " ".join(layouts),
            "collectives": self.collectives.describe(),
            "all_gather": self.all_gather,
        }
        if padding:
            self.details["padding"] = ", ".join(padding)
        if config.shard_weights:
            self.details["shard_weights"] = "not split: " + (", ".join(plan.not_split) or "none")
        if self.gathered:
            self.details["weights_all_gathered"] = self.gathered
        if self.definition.has_running_statistics:
            self.details["running_statistics"] = "assigned once a step, from the global batch's values"
        if not config.quiet:
            log(
                f"{'dtensor':<10} {self.placement}; input {config.dtensor_input}; collectives "
                + self.describe_layouts()
            )

    def expansion_failure(self, values: Sequence[np.ndarray]) -> str:
        """DTensor's error (one line) when it cannot expand the first-step gradients or a train step with the
        weights split on the batch axis (each function's layouts propagate differently: the ViT's gradients
        failed where its train step did not); "" when it can. The probes are the run's own first calls (the first
        batch, their traces kept for training); then the weights go back to `values`, the optimizer's state to 0."""
        batch, _ = next(packed_batches(self.data, self.config, 0, self.mesh))
        try:
            compute_gradients(self.model, self.optimizer, *batch)
            float(train_steps(self.model, self.optimizer, [batch], self.config.dtype == "float64")[0][-1])
        except (tf.errors.UnknownError, tf.errors.InvalidArgumentError) as error:
            message = str(error).split("error: ", 1)[-1].splitlines()[0]
            return f"DTensor could not expand the model with its weights split on the batch axis ({message[:160]})"
        for weight, value in zip(self.model.weights, values, strict=True):
            weight.assign(on_mesh(value, weight.layout))
        for variable in self.optimizer.variables:
            zeros = dtensor.call_with_layout(tf.zeros, variable.layout, shape=variable.shape, dtype=variable.dtype)
            variable.assign(zeros)
        return ""

    def describe_layouts(self) -> str:
        """The log line's account of the layouts: what the model and the batch axes split, and what pads."""
        count = len(self.plan.specs)
        on = {axis: sum(axis in spec for spec in self.plan.specs) for axis in (MODEL_AXIS, BATCH_AXIS)}
        split = [f"{on[MODEL_AXIS]} of {count} variables split on the model axis"] if on[MODEL_AXIS] else []
        if self.config.shard_weights:
            split.append(
                f"{on[BATCH_AXIS]} of {count} weights and their optimizer slots split on the batch axis"
                + (f" (not {', '.join(self.plan.not_split)})" if self.plan.not_split else "")
            )
        elif on[BATCH_AXIS]:
            split.append(f"{on[BATCH_AXIS]} of {count} variables split on the batch axis")
        if self.gathered:
            split.append("the forward all-gathers them: " + self.gathered)
        if split:  # a layout that DTensor gathers: the lowering it gathers with
            split.append(f"all-gathers as {self.all_gather}")
        text = f"{self.collectives.describe()}; " + ("; ".join(split) or "every variable replicated")
        return text + (f"; padded with zero units: {self.details['padding']}" if "padding" in self.details else "")

    def gradients(self, x, y):
        grads = compute_gradients(self.model, self.optimizer, *pack_batch(x, y, self.mesh))
        return self.definition.unpad([to_numpy(g) for g in grads], self.definition.trainable_variables)

    def taps(self, x, y) -> Taps:
        return record_taps(self.model, self.optimizer, *pack_batch(x, y, self.mesh), len(y))

    def train_epoch(self, epoch: int, meter, first: bool, record_state: bool):
        # Every epoch is grouped alike, the first batch alone: its call's time is the trace time plus a
        # step's, and every call shape traces in the first epoch, none in a measured one.
        batches = packed_batches if self.config.dtensor_input == "pack" else dataset_batches
        items = iter(batches(self.data, self.config, epoch, self.mesh))
        self.call([next(items)], meter, record_state)
        if self.steps_per_call is None:
            self.steps_per_call = steps_per_call(self.device_type, self.traced_operations(record_state))
        for group in equal_shape_runs(items, lambda item: item[0][0].shape, self.steps_per_call):
            self.call(group, meter, record_state)

    def call(self, group, meter, record_state: bool):
        losses, corrects, checksums = train_steps(
            self.model, self.optimizer, [batch for batch, _ in group], record_state
        )
        # Wait for the call's last step: a call of several steps can return before they have
        # run, and the step times would then be dispatch times (measured: ~3% of throughput).
        float(losses[-1])
        meter.add_steps(losses, corrects, [real_count for _, real_count in group], checksums if record_state else None)

    def traced_operations(self, record_state: bool) -> int:
        """Operations in the traced one-step call (deterministic, unlike its trace time)."""
        first_batch, _ = next(iter(packed_batches(self.data, self.config, 0, self.mesh)))
        graph = train_steps.get_concrete_function(
            self.model, self.optimizer, [first_batch], record_state
        ).graph.as_graph_def()
        return len(graph.node) + sum(len(function.node_def) for function in graph.library.function)

    def trace_count(self) -> int:
        return train_steps.experimental_get_tracing_count()

    def step_call(self) -> profile.StepCall:
        """--profile: a measured epoch's second call (its first full group of steps), packed on the host."""
        batches = list(epoch_batches(self.data.x_train, self.data.y_train, self.config.batch_size))
        group = next(equal_shape_runs(batches[1:], lambda batch: batch[0].shape, self.steps_per_call or 1), batches[:1])

        def prepare():
            return [pack_batch(x, y, self.mesh) for x, y in group]

        def run(packed):
            float(train_steps(self.model, self.optimizer, packed)[0][-1])  # host sync: the call has run

        def count():
            packed = prepare()
            step = train_steps.get_concrete_function(self.model, self.optimizer, packed, False)
            devices = [short_device(device) for device in self.mesh.local_devices()]
            return dtensor_traffic(step, len(packed), self.spec.axes, devices)

        notes = "input packed (training took DTensorDataset)" if self.config.dtensor_input == "dataset" else ""
        return profile.StepCall(len(group), prepare, run, count, notes)

    def evaluate(self, x, y):
        """(mean loss, accuracy) over a whole split; one host sync at the end."""
        results = [
            test_step(self.model, *pack_batch(x_batch, y_batch, self.mesh))
            for x_batch, y_batch in epoch_batches(x, y, self.config.batch_size)
        ]
        total_loss = sum(float(batch_loss) for batch_loss, _ in results)  # host sync point
        total_correct = sum(float(batch_correct) for _, batch_correct in results)
        return total_loss / host_label_count(y), total_correct / host_label_count(y)

    def state(self):
        return state_variables(self.model, self.optimizer)  # padded units are zero: they add nothing to a checksum

    def final_weights(self):
        return self.definition.unpad([to_numpy(w) for w in self.model.weights])  # an all-gather per sharded one

    def memory_per_device(self):
        return memory_per_device(self.model, self.optimizer)

    def predict_logits(self, x: np.ndarray) -> np.ndarray:
        """Logits for host images, computed on the mesh: what --export checks its SavedModel against."""
        inputs, _, _ = pack_batch(x, np.zeros(len(x), np.int64), self.mesh)
        return to_numpy(forward(self.model, inputs))[: len(x)]

    def begin(self, start_epoch: int):
        if self.config.restore and self.checkpointed[0] is not self.model:  # restored into the host copy
            copy_from_host(*self.checkpointed, self.model, self.optimizer)

    def finish(self, history: History):
        history.details["steps_per_call"] = str(self.steps_per_call or 1)

    def before_save(self):
        if self.checkpointed[0] is not self.model:
            copy_to_host(self.model, self.optimizer, *self.checkpointed)


def process_environment(config: Config) -> Dict[str, str]:
    """One intra-op thread on logical CPUs: 8 devices on 2 cores otherwise share TensorFlow's default pool of
    one thread per core, and every op waits for its turn (docs/throughput.md, "Threads": 1.0-1.6x faster)."""
    return {"TF_NUM_INTRAOP_THREADS": "1"} if config.device_type == "CPU" else {}


def describe_run(config: Config) -> RunFacts:
    """The header's facts, before anything trains (--clients: the mesh spans every client's devices)."""
    spec = parse_mesh(config.mesh, config.devices * config.clients)
    sharded = ", weights and optimizer slots split on the batch axis" if config.shard_weights else ""
    return RunFacts(f"DTensor mesh {spec}{sharded}", f"{config.batch_size // spec.batch} (DTensor)")


def variants(config: Config, count: int, every_layout: bool, meshes: Sequence[str] = ()) -> List[Variant]:
    """Its configurations at `count` devices: every mesh (batch x model) for the sweep, or batch=N only;
    the Python API's `meshes` each."""
    if meshes:
        return [Variant(f"dtensor {mesh}", config.replace(devices=count, mesh=mesh), mesh=mesh) for mesh in meshes]
    if not every_layout:
        spec, shard = MeshSpec(batch=count), config.shard_weights and count > 1
        changed = config.replace(devices=count, mesh=str(spec), shard_weights=shard)
        return [Variant("dtensor", changed, mesh=str(spec), shard_weights=shard)]
    found = []
    for spec in every_mesh(count):  # each mesh replicated, then with its weights split on a batch axis of 2 or more
        for shard in (False, True) if spec.batch > 1 else (False,):
            changed = config.replace(devices=count, mesh=str(spec), shard_weights=shard)
            found.append(Variant("dtensor", changed, mesh=str(spec), shard_weights=shard))
    return found


# --- several processes (--clients): DTensor's multi-client mesh ---------------------------------

CLUSTER_VARIABLES = ("DTENSOR_CLIENT_ID", "DTENSOR_NUM_CLIENTS", "DTENSOR_JOB_NAME", "DTENSOR_JOBS")
JOB_NAME = "worker"


def cluster_variables() -> Tuple[str, ...]:
    return CLUSTER_VARIABLES


def cluster_role(config: Config, environ: Mapping[str, str]) -> Optional[ClusterRole]:
    """This client's place from DTENSOR_*; None when none is set."""
    found = [name for name in CLUSTER_VARIABLES if name in environ]
    if not found:
        return None
    missing = [name for name in CLUSTER_VARIABLES if name not in environ]
    if missing:
        raise UsageError(
            f"{', '.join(found)} set but not {', '.join(missing)}; a DTensor client "
            f"needs all of {', '.join(CLUSTER_VARIABLES)}"
        )
    client_id = int(environ["DTENSOR_CLIENT_ID"])
    jobs = environ["DTENSOR_JOBS"].split(",")
    address = jobs[client_id] if 0 <= client_id < len(jobs) else ""
    return ClusterRole(client_id, int(environ["DTENSOR_NUM_CLIENTS"]), "DTENSOR_CLIENT_ID", address, "DTENSOR_JOBS")


def client_environment(client_id: int, addresses: Sequence[str]) -> Dict[str, str]:
    return {
        "DTENSOR_CLIENT_ID": str(client_id),
        "DTENSOR_NUM_CLIENTS": str(len(addresses)),
        "DTENSOR_JOB_NAME": JOB_NAME,
        "DTENSOR_JOBS": ",".join(addresses),
    }


def join_cluster(config: Config) -> None:
    """--clients: start this client's part of DTensor's runtime (reads DTENSOR_*), before anything else
    starts it. In multi-client mode its shutdown_accelerator_system() raises, so it is never called."""
    combining.settle(config.device_type)  # before DTensor starts: dtensor_impl/combining.py
    nccl.settle(config.device_type, config.devices, config.dtensor_nccl)  # DTENSOR_GPU_USE_NCCL_COMMUNICATION
    dtensor.initialize_accelerator_system(config.device_type)


def fit(config: Config, data: Dataset, devices: Sequence[str], log: Callable = print) -> History:
    """Train on a mesh over exactly `devices` and return the shared history record."""
    return loop.fit(DTensorTrainer(config, data, devices, log), config, data, log)
