"""The DTensor trainer: TensorFlow's "Distributed training with Core APIs and DTensor", made exact.

    python compare.py --trainers reference,dtensor --data embedded
    python compare.py --trainers dtensor --mesh batch=4,model=2 --dtensor-input dataset

Top to bottom like the tutorial: a mesh over the devices, the model's variables as `dtensor.DVariable`s in
their layouts (variables.py), the shared Adam or SGD with slots in their weight's layout, each global batch
as DTensors sharded on the batch axis (inputs.py), and `train_step` / `test_step` as tf.functions, up to
STEPS_PER_CALL steps per call. Where it departs from the tutorial, and what each choice costs: docs/trainers.md.
"""

import time
from typing import Callable, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from dtensor_vs_mirrored.dtensor_impl import combining, gathering, nccl, variables
from dtensor_vs_mirrored.dtensor_impl.captures import on_mesh
from dtensor_vs_mirrored.dtensor_impl.inputs import dataset_batches, pack_batch, packed_batches, padded_length
from dtensor_vs_mirrored.dtensor_impl.layouts import layout_plan
from dtensor_vs_mirrored.dtensor_impl.mesh import BATCH_AXIS, create_client_mesh, create_mesh, mesh_spec
from dtensor_vs_mirrored.dtensor_impl.traffic import dtensor_traffic
from dtensor_vs_mirrored.dtensor_impl.variables import build_model, build_optimizer, to_numpy
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.console import status
from dtensor_vs_mirrored.shared.measure import profile
from dtensor_vs_mirrored.shared.measure.checksums import state_checksums, state_variables
from dtensor_vs_mirrored.shared.measure.history import History
from dtensor_vs_mirrored.shared.measure.memory import short_device
from dtensor_vs_mirrored.shared.measure.taps import Taps
from dtensor_vs_mirrored.shared.model.definition import MODEL_AXIS
from dtensor_vs_mirrored.shared.model.registry import definition_for
from dtensor_vs_mirrored.shared.training import batch_inputs, step
from dtensor_vs_mirrored.shared.training.batches import epoch_batches, equal_shape_runs
from dtensor_vs_mirrored.shared.training.build import build_model_and_optimizer
from dtensor_vs_mirrored.shared.training.data import Dataset
from dtensor_vs_mirrored.shared.training.loss_scale import loss_scale_of, mixed_compute
from dtensor_vs_mirrored.shared.training.losses import label_count
from dtensor_vs_mirrored.shared.training.protocol import Trainer

STEPS_PER_CALL = 4  # steps per train_steps call: one dispatch for several (docs/trainers.md, "Steps per call")
UNROLL_MAX_OPERATIONS = 1000  # a larger step's graph traces too long unrolled: one step per call


def steps_per_call(device_type: str, step_operations: int = 0) -> int:
    """STEPS_PER_CALL while DTensor's all-reduce combining is off in this process and one step's graph has at
    most UNROLL_MAX_OPERATIONS operations, else 1: with the combining on, a DVariable read after an assign in
    the same tf.function returns the value from before it, so every step after a call's first would read stale
    weights (dtensor_impl/combining.py)."""
    if combining.settle(device_type) or step_operations > UNROLL_MAX_OPERATIONS:
        return 1
    return STEPS_PER_CALL


# --- the steps ------------------------------------------------------------------------------


def training_context(model, optimizer, x, record: bool = False):
    """The forward's context in a step: x is the global batch in DTensor's global view (its padding examples last)."""
    positions = tf.range(batch_inputs.first(x).shape[0], dtype=tf.int64)
    return model.training_context(optimizer.step, positions, record, loss_scale_of(optimizer))


def into_layout(value, variable):
    """A running statistic's new value in its variable's layout (DTensor assigns only a value of the same)."""
    return dtensor.relayout(tf.cast(value, variable.dtype), variable.layout)


@on_mesh
def compute_gradients(model, optimizer, x, y, example_weights):
    context = training_context(model, optimizer, x)
    return step.loss_and_gradients(model, x, y, label_count(y, example_weights), context, example_weights)[2]


@on_mesh
def train_step(model, optimizer, x, y, example_weights):
    """One optimizer step on a global batch; returns (mean loss, correct count, gradients) before the update. The
    real-example count is summed from the weights on the devices, so it is global and the padded last batch needs
    no input."""
    context = training_context(model, optimizer, x)
    count = label_count(y, example_weights)
    logits, loss, grads = step.loss_and_gradients(model, x, y, count, context, example_weights)
    with tf.name_scope(profile.UPDATE_SCOPE):
        model.apply_updates(context, into_layout)  # running statistics: once, from the global batch
        optimizer.apply_gradients(grads, model.trainable)
    return loss, step.correct(model, logits, y, example_weights), grads


@on_mesh
def train_steps(model, optimizer, batches, record_state: bool = False, with_gradients: bool = False):
    """`train_step` on each packed (x, y, example_weights) of `batches` in turn, in one call.

    The Python loop unrolls when traced: one graph of len(batches) steps, so one dispatch instead of several.
    Returns ([mean losses], [correct counts], [state checksums], gradients), one per step; the checksums (at
    each step's start) only with `record_state`, else []; with `with_gradients`, a one-step call's gradients
    (what the run's first call gives as its first-step gradients: no function of their own to trace), else [].
    """
    losses, corrects, checksums, grads = [], [], [], []
    for batch in batches:
        if record_state:
            checksums.append(state_checksums(state_variables(model, optimizer)))
        loss, correct, grads = train_step(model, optimizer, *batch)
        losses.append(loss)
        corrects.append(correct)
    return losses, corrects, checksums, grads if with_gradients and len(batches) == 1 else []


@on_mesh
def forward(model, x):
    """The model on the mesh in a traced function: eagerly, an op between a DTensor and a constant the forward
    makes (the GPT's causal mask) is refused."""
    return model(x)


test_step = on_mesh(step.test_sums)


# --- the trainer ----------------------------------------------------------------------------


class DTensorTrainer(Trainer):
    """The parts shared.training.loop.fit calls, on a mesh over exactly `devices` (every client's with --clients)."""

    name = "dtensor"

    def __init__(self, config: Config, data: Dataset, devices: Sequence[str], log: Callable = print):
        self.config, self.data = config, data
        self.spec = mesh_spec(config.mesh, len(devices) * config.clients, config.batch_size)
        self.device_type = devices[0].split(":")[0]
        combining.settle(self.device_type)  # before anything starts DTensor in this process
        self.collectives = nccl.settle(self.device_type, len(devices), config.dtensor_nccl)  # compare.py's came first
        self.all_gather = gathering.settle(self.device_type, self.spec.model or 1, config.clients)  # before lowering
        self.mesh, self.placement = self.place(devices)
        self.definition = definition_for(config)
        self.pad_to = config.batch_size if self.definition.independent_examples else 0  # a short batch: inputs.py
        status(f"dtensor on {self.placement}: placing the variables")
        self.plan = layout_plan(config, self.spec)  # a width an axis does not divide gets zero units
        values = self.definition.pad(self.definition.initial_values(config.seed, config.weight_dtype), self.plan.sizes)
        # Why the forward all-gathers the weights split on the batch axis, or why DTensor's expansion computes with
        # them ("" each where it does not): build, choose_forward.
        self.gathered, self.expanded = self.build(values, config.sharded_forward)
        # A one-step call returns its gradients (train_steps), but not where DTensor's expansion computes with weights
        # split on the batch axis: as outputs there they changed the step's layouts (the GPT's sharded batch=8 sent
        # 32 MB more a step); all-gathered, the same bytes (choose_forward probes that call).
        self.steps_give_gradients = bool(self.gathered) or not any(BATCH_AXIS in spec for spec in self.plan.specs)
        self.steps_per_call = None  # decided by the first call's graph (steps_per_call)
        # Checkpoints hold the unpadded model, so any trainer and mesh restores them: with padding, an
        # unpadded copy on the host is what they read and write (one all-gather per save).
        self.checkpointed = (self.model, self.optimizer)
        if self.padding():
            with tf.device("CPU:0"):
                self.checkpointed = build_model_and_optimizer(config)
        self.details = self.describe()
        if not config.quiet:
            log(
                f"{'dtensor':<10} {self.placement}; input {config.dtensor_input}; collectives "
                + self.describe_layouts()
            )

    def place(self, devices: Sequence[str]):
        """(the mesh over exactly `devices`, every client's with --clients; the placement the tables show)."""
        config, spec = self.config, self.spec
        sharded = ", sharded" if config.shard_weights else ""
        if config.clients > 1:  # multi-client: pack_batch then packs only this client's shards
            placement = f"mesh {spec} over {config.clients} clients x {len(devices)} {self.device_type}{sharded}"
            return create_client_mesh(spec, self.device_type), placement
        return create_mesh(spec, devices), f"mesh {spec} over {len(devices)} x {self.device_type}{sharded}"

    def build(self, values: Sequence[np.ndarray], forward: str) -> Tuple[str, str]:
        """The model and optimizer on the mesh; returns (why the forward all-gathers the weights split on the batch
        axis: `forward` "gather" asked for it, or what choose_forward found for "auto"; why DTensor's expansion
        computes with them), "" for each that does not."""
        self.model = build_model(
            self.definition,
            values,
            self.mesh,
            self.plan,
            seed=self.config.seed,
            compute_dtype=mixed_compute(self.config),
        )
        self.optimizer = build_optimizer(self.config, self.model, self.mesh)
        if not any(BATCH_AXIS in spec for spec in self.plan.specs):
            return "", ""
        asked = f"asked for (--sharded-forward {forward})"
        if forward == "gather":
            self.model, self.optimizer = self.gathering_model(values)
            return asked, ""
        doing = "tracing the step expanded" if forward == "expand" else "tracing a step each way"
        status(f"dtensor on {self.placement}: {doing} with the weights split on the batch axis")
        started = time.perf_counter()
        if forward == "expand":
            self.check_expansion(values)
            found = ("", asked)
        else:
            found = self.choose_forward(values)
        self.probed_seconds = time.perf_counter() - started  # the kept model's trace is the run's (its trace time)
        return found

    def gathering_model(self, values: Sequence[np.ndarray]):
        model = build_model(
            self.definition,
            values,
            self.mesh,
            self.plan,
            gather=True,
            seed=self.config.seed,
            compute_dtype=mixed_compute(self.config),
        )
        return model, build_optimizer(self.config, model, self.mesh)

    def choose_forward(self, values: Sequence[np.ndarray]) -> Tuple[str, str]:
        """Of the two forwards for weights split on the batch axis, DTensor's SPMD expansion and the explicit
        all-gather (FSDP's), the one whose step sends fewer bytes, each counted in its own traced first step: the
        expansion computes with the split weights by moving activations, which costs more where activations
        outweigh the weights (the GPT's batch=8 sharded: 107.94 MB a step expanded, 1.13 MB gathered; the MLP's
        3.90 against 9.14). The gather, with the reason, where DTensor cannot expand a step or the first-step
        gradients. The probes are the run's own first calls (the kept model's traces are reused); the weights go
        back to `values` after them. Returns (why it gathers, why it expands), one of them ""."""
        batch = self.first_batch()
        record = self.config.dtype == "float64"
        expanded = self.expansion_error(lambda: self.probe_step(self.model, self.optimizer, batch, record))
        gathering = self.gathering_model(values)
        if expanded:
            self.model, self.optimizer = gathering
            return expanded, ""
        expanded_bytes = self.probe_bytes(self.model, self.optimizer, batch, record, False)
        self.probe_step(*gathering, batch, record, True)  # as the run calls it gathered (steps_give_gradients)
        gathered_bytes = self.probe_bytes(*gathering, batch, record, True)
        variables.reset(*gathering, values)
        compared = expanded_bytes is not None and gathered_bytes is not None
        if compared and gathered_bytes < expanded_bytes:
            self.model, self.optimizer = gathering
            return f"{gathered_bytes / 2**20:.2f} MB a step against {expanded_bytes / 2**20:.2f} MB expanded", ""
        failed = self.expansion_error(lambda: compute_gradients(self.model, self.optimizer, *batch))
        if failed:
            self.model, self.optimizer = gathering
            return failed, ""
        variables.reset(self.model, self.optimizer, values)
        if not compared:
            return "", "the all-gather's bytes not counted here"
        return "", f"{expanded_bytes / 2**20:.2f} MB a step against {gathered_bytes / 2**20:.2f} MB all-gathered"

    def check_expansion(self, values: Sequence[np.ndarray]) -> None:
        """--sharded-forward expand: DTensor expands the step and the first-step gradients (the run's own first
        traces), or the run fails here with DTensor's reason in one line; the weights go back to `values`."""
        batch = self.first_batch()
        record = self.config.dtype == "float64"
        failed = self.expansion_error(
            lambda: self.probe_step(self.model, self.optimizer, batch, record)
        ) or self.expansion_error(lambda: compute_gradients(self.model, self.optimizer, *batch))
        if failed:
            raise ValueError(f"--sharded-forward expand: {failed}; use gather or auto")
        variables.reset(self.model, self.optimizer, values)

    @staticmethod
    def expansion_error(call) -> str:
        """DTensor's error (one line) when it cannot expand what `call` traces with the weights split on the batch
        axis; "" when it can."""
        try:
            call()
        except (tf.errors.UnknownError, tf.errors.InvalidArgumentError) as error:
            message = str(error).split("error: ", 1)[-1].splitlines()[0]
            return f"DTensor could not expand the model with its weights split on the batch axis ({message[:160]})"
        return ""

    @staticmethod
    def probe_step(model, optimizer, batch, record: bool, with_gradients: bool = False) -> None:
        float(train_steps(model, optimizer, [batch], record, with_gradients)[0][-1])

    def probe_bytes(self, model, optimizer, batch, record: bool, with_gradients: bool):
        """The bytes a device sends in probe_step's call (already run); None where they are not counted here."""
        traffic, _ = self.call_traffic(model, optimizer, [batch], record, with_gradients)
        return None if traffic is None else traffic.link_bytes

    def call_traffic(self, model, optimizer, packed, record: bool, with_gradients: bool):
        """(Traffic, "") of a train_steps call already run on `packed`, from what DTensor lowered it to; (None, why)
        when that is not found (dtensor_impl/traffic.py)."""
        step = train_steps.get_concrete_function(model, optimizer, packed, record, with_gradients)
        devices = [short_device(device) for device in self.mesh.local_devices()]
        return dtensor_traffic(step, len(packed), self.spec.axes, devices)

    def padding(self) -> str:
        """The named sizes padded with zero units for this mesh, e.g. "hidden 700 -> 704"; "" when none is."""
        sizes = self.plan.sizes
        return ", ".join(
            f"{name} {size} -> {sizes[name]}" for name, size in self.definition.sizes.items() if sizes[name] != size
        )

    def describe(self) -> dict:
        """The JSON report's facts: the mesh, its input, layouts, collectives and what they gather with."""
        details = {
            "mesh": str(self.spec),
            "dtensor_input": self.config.dtensor_input,
            "layouts": " ".join(self.plan.describe(self.definition)),
            "collectives": self.collectives.describe(),
            "all_gather": self.all_gather,
            # DTensor's all-reduce combining in this process (combining.py): "on" combines a step's all-reduces and
            # runs one step a call; "off" sends one a gradient and may unroll several steps a call.
            "all_reduce_combining": "on" if combining.settle(self.device_type) else "off",
        }
        optional = {
            "padding": self.padding(),
            "shard_weights": self.config.shard_weights and "not split: " + (", ".join(self.plan.not_split) or "none"),
            "weights_all_gathered": self.gathered,
            "weights_expanded": self.expanded,
            "running_statistics": self.definition.has_running_statistics
            and "assigned once a step, from the global batch's values",
        }
        return {**details, **{key: value for key, value in optional.items() if value}}

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
        elif self.expanded:
            split.append("DTensor's expansion computes with them: " + self.expanded)
        if split:  # a layout that DTensor gathers: the lowering it gathers with
            split.append(f"all-gathers as {self.all_gather}")
        text = f"{self.collectives.describe()}; " + ("; ".join(split) or "every variable replicated")
        return text + (f"; padded with zero units: {self.details['padding']}" if "padding" in self.details else "")

    def gradients(self, x, y):
        packed = pack_batch(x, y, self.mesh, self.pad_to)
        return self.host_gradients(compute_gradients(self.model, self.optimizer, *packed))

    def host_gradients(self, grads):
        """Gradients on the mesh as unpadded host arrays, each assembled from its per-device pieces."""
        return self.definition.unpad([to_numpy(g) for g in grads], self.definition.trainable_variables)

    def taps(self, x, y) -> Taps:
        """All-gathered, the padding examples cut."""
        x_mesh, y_mesh, weights = pack_batch(x, y, self.mesh, self.pad_to)
        make_context = lambda: training_context(self.model, self.optimizer, x_mesh, record=True)  # noqa: E731
        return step.record_taps(
            self.model, x_mesh, y_mesh, make_context, lambda value: to_numpy(value)[: len(y)], weights, on_mesh
        )

    def step(self, x, y):
        train_steps(self.model, self.optimizer, [pack_batch(x, y, self.mesh, self.pad_to)])

    def train_epoch(self, epoch: int, meter, first: bool, record_state: bool):
        # Every epoch is grouped alike, the first batch alone: its call's time is the trace time plus a
        # step's, and every call shape traces in the first epoch, none in a measured one.
        batches = packed_batches if self.config.dtensor_input == "pack" else dataset_batches
        items = iter(batches(self.data, self.config, epoch, self.mesh, self.pad_to))
        opening = next(items)
        first_shape = batch_inputs.first(opening[0][0]).shape
        grads = self.call([opening], meter, record_state)
        if first:
            self.first_grads = grads  # read back after the epoch: first_call_gradients
        if self.steps_per_call is None:
            self.steps_per_call = steps_per_call(self.device_type, self.traced_operations(record_state))
        for group in equal_shape_runs(items, lambda item: batch_inputs.first(item[0][0]).shape, self.steps_per_call):
            # A short run of full batches goes one step a call, the first call's shape: each call length traces
            # (a trace of its own costs seconds of the first epoch, for a call that runs a step or two).
            full = len(group) == self.steps_per_call or batch_inputs.first(group[0][0][0]).shape != first_shape
            for calls in [group] if full else [[item] for item in group]:
                self.call(calls, meter, record_state)

    def call(self, group, meter, record_state: bool):
        """The steps of `group` in one train_steps call, into `meter`; returns a one-step call's gradients."""
        losses, corrects, checksums, grads = train_steps(
            self.model, self.optimizer, [batch for batch, _ in group], record_state, self.steps_give_gradients
        )
        # Wait for the call's last step: a call of several steps can return before they have
        # run, and the step times would then be dispatch times (measured: ~3% of throughput).
        float(losses[-1])
        meter.add_steps(losses, corrects, [real_count for _, real_count in group], checksums if record_state else None)
        return grads

    def first_batch(self):
        """The run's first global batch on the mesh, packed as its first call takes it."""
        return next(packed_batches(self.data, self.config, 0, self.mesh, self.pad_to))[0]

    def traced_operations(self, record_state: bool) -> int:
        """Operations in the traced one-step call (deterministic, unlike its trace time)."""
        graph = train_steps.get_concrete_function(
            self.model, self.optimizer, [self.first_batch()], record_state, self.steps_give_gradients
        ).graph.as_graph_def()
        return len(graph.node) + sum(len(function.node_def) for function in graph.library.function)

    def trace_count(self) -> int:
        return train_steps.experimental_get_tracing_count()

    def steady_group(self) -> list:
        """The host batches of a call a measured epoch makes: its first full group of steps, or with none (fewer
        full batches than a group, which go one a call: train_epoch) its first batch, as the first call."""
        batches = list(epoch_batches(self.data.x_train, self.data.y_train, self.config.batch_size))
        length, shards = self.steps_per_call or 1, self.mesh.dim_size(BATCH_AXIS)
        groups = equal_shape_runs(batches[1:], lambda batch: padded_length(len(batch[1]), shards, self.pad_to), length)
        return next((group for group in groups if len(group) == length), batches[:1])

    def step_call(self, most_steps: int = 0) -> profile.StepCall:  # its calls' step count is traced: most_steps unused
        group = self.steady_group()

        def run(packed):
            float(train_steps(self.model, self.optimizer, packed, False, self.steps_give_gradients)[0][-1])  # host sync

        notes = "input packed (training took DTensorDataset)" if self.config.dtensor_input == "dataset" else ""
        prepare = lambda: [pack_batch(x, y, self.mesh, self.pad_to) for x, y in group]  # noqa: E731
        return profile.StepCall(len(group), prepare, run, notes, examples=sum(len(y) for _, y in group))

    def test_batches(self, x, y):
        return (
            pack_batch(x_batch, y_batch, self.mesh, self.pad_to)
            for x_batch, y_batch in epoch_batches(x, y, self.config.batch_size)
        )

    def test_step(self, batch):
        return test_step(self.model, *batch)

    def state(self):
        return state_variables(self.model, self.optimizer)  # padded units are zero: they add nothing to a checksum

    def final_weights(self):
        return self.definition.unpad([to_numpy(w) for w in self.model.weights])  # assembled on the host: no collective

    def per_device(self, tensors):
        """Every DVariable's per-device components (padding included: it is held)."""
        return [component for tensor in tensors for component in dtensor.unpack(tensor.read_value())]

    def predict_logits(self, x: np.ndarray) -> np.ndarray:
        """Logits for host inputs, computed on the mesh: what --export checks its SavedModel against."""
        count = len(batch_inputs.first(x))
        inputs, _, _ = pack_batch(x, np.zeros(count, np.int64), self.mesh)
        return to_numpy(forward(self.model, inputs))[:count]

    def begin(self, start_epoch: int):
        if self.config.restore and self.checkpointed[0] is not self.model:  # restored into the host copy
            variables.copy_from_host(*self.checkpointed, self.model, self.optimizer)

    def finish(self, history: History):
        history.details["steps_per_call"] = str(self.steps_per_call or 1)

    def before_save(self):
        if self.checkpointed[0] is not self.model:
            variables.copy_to_host(self.model, self.optimizer, *self.checkpointed)
