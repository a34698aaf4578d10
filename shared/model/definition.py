"""What a model is to every trainer: named variables with initial values, one forward, a layout each.

A `ModelDefinition` is values plus one function (flax's `apply_model`): each `Variable` has a
name (its checkpoint key under `model/`), a shape, an initializer run once on the host from the
run's seed, and the dimension a DTensor mesh's `model` axis splits. `forward(variables, inputs)`
is pure and the same on one device, under MirroredStrategy and on a mesh. What one example is
(its input's shape and dtype, its labels' shape, the class count), the per-label loss and the
data it trains on by default are the definition's too. `Model` holds one set of the variables,
made by whatever the trainer makes variables with. Built-in definitions: shared/model/mlp.py,
vit.py, gpt.py; `--model FILE.py:FUNCTION` loads yours (shared/model/registry.py).
"""

import dataclasses
import functools
import math
import re
from typing import Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.model.forward import ForwardContext, takes_context
from dtensor_vs_mirrored.shared.model.named_inputs import INPUT_DTYPES, NamedInput, check_inputs

MODEL_AXIS = "model"
BATCH_AXIS = "batch"  # a mesh's data axis: a weight named on it is split over the data-parallel devices (FSDP)
UNSHARDED = "unsharded"  # dtensor.UNSHARDED
MESH_AXES = (BATCH_AXIS, MODEL_AXIS)
Shape = Tuple[Union[int, str], ...]  # ints, or names of ModelDefinition.sizes (a named size may be padded)
Initializer = Callable[[Tuple[int, ...], int], np.ndarray]  # (shape, the run's seed) -> float32 values
# Attributes of tf.Module that a variable's first name component would shadow.
RESERVED_NAMES = frozenset(
    {
        "name",
        "name_scope",
        "variables",
        "trainable_variables",
        "non_trainable_variables",
        "submodules",
        "weights",
        "definition",
        "with_name_scope",
    }
)
# What a label is: "classes", an integer class id per label (the output's last axis its classes' logits); "binary",
# 0 or 1 per output unit (one or several labels: a binary or multi-label classifier); "values", any float per output
# unit (a regression). The last two are the output's shape, and their loss gives one value per example (and
# position): it averages the output's last axis, as Keras's losses do (shared/training/losses.py).
TARGETS = ("classes", "binary", "values")
DEFAULT_DATA = ("mnist", "tiny_shakespeare")  # what --data auto/tfds/embedded loads for the model
NAME_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*|\d+)$")


def zeros(shape, seed):
    return np.zeros(shape, np.float32)


def ones(shape, seed):
    return np.ones(shape, np.float32)


def truncated_normal(stddev: float, stream: int) -> Initializer:
    """Stateless truncated normal * stddev from seed (seed, stream): each variable its own stream."""

    def draw(shape, seed):
        with tf.device("/CPU:0"):
            return (tf.random.stateless_truncated_normal(shape, seed=(seed, stream)) * stddev).numpy()

    return draw


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str  # "layers/0/w": its checkpoint key under model/ ("/"-separated identifiers or indices)
    shape: Shape
    init: Initializer = zeros
    # On a DTensor mesh: per dimension "model", "batch" or "unsharded", each axis on at most one dimension;
    # () replicated. "model" applies on a mesh with a model axis; "batch" splits the weight over the
    # data-parallel devices (--shard-weights adds it to every weight it can).
    layout: Tuple[str, ...] = ()
    label: str = ""  # how parity messages name it ("layer 0 weight"); the name when empty
    # False: running statistics (a moving mean) that the forward updates through context.update rather than a
    # weight the optimizer steps: no gradient, no optimizer slots; judged, checkpointed and exported as a weight.
    trainable: bool = True

    @property
    def split_dim(self) -> Optional[int]:
        return self.layout.index(MODEL_AXIS) if MODEL_AXIS in self.layout else None


@dataclasses.dataclass(frozen=True)
class OptimizerChoice:
    """The optimizer a model asks for (a compiled Keras Adam or SGD), as the project's Adam or SGD trains it."""

    name: str  # "adam" or "sgd"
    learning_rate: object  # a float, or (the updates applied so far, an int64 tensor) -> this update's rate
    description: str  # how the header names it: "Adam(learning_rate=CosineDecay(0.01, 100 steps))"
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7


@dataclasses.dataclass(frozen=True)
class Caution:
    """What a trainer will compute differently from one device, and why, known from the model before anything trains
    (a Keras BatchNormalization without synchronized=True): in the header and the JSON, and in the reason of a
    trainer it names whose verdict is MISMATCH or FAILED."""

    text: str  # one line that names the layers: "bn: BatchNormalization without synchronized=True normalises ..."
    trainers: Tuple[str, ...] = ()  # the trainers ("dtensor", "mirrored") it explains a difference of; () none
    random: bool = False  # it names the forward's own random ops (so the generic random-op hint is left out)
    in_reason: bool = True  # False: it changes only what is reported (Keras's metrics), never what parity judges


NAMES_SHOWN = 4  # names listed in a message before "... and N more"


def summarise_named_state(names: Sequence[str], all_names: Sequence[str]) -> str:
    """Any model's state names, grouped where a whole group differs: "every variable and Adam slot",
    "every variable, blocks/0/mlp/w1 Adam m, ... and 3 more"."""
    groups = []
    for label, slot in (
        ("every variable", lambda n: " Adam " not in n),
        ("every Adam m", lambda n: n.endswith(" Adam m")),
        ("every Adam v", lambda n: n.endswith(" Adam v")),
    ):
        members, everything = [n for n in names if slot(n)], [n for n in all_names if slot(n)]
        if members and set(members) == set(everything):
            groups.append(label)
        else:
            groups += members
    if groups[:3] == ["every variable", "every Adam m", "every Adam v"]:
        groups[:3] = ["every variable and Adam slot"]
    return listed(groups)


def listed(names: Sequence[str]) -> str:
    """Names as a message lists them: the first NAMES_SHOWN, then "... and N more"."""
    more = [f"... and {len(names) - NAMES_SHOWN} more"] if len(names) > NAMES_SHOWN else []
    return ", ".join([*names[:NAMES_SHOWN], *more])


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: hashed by identity, as tf.function arguments are
class ModelDefinition:
    name: str  # what a checkpoint records and restore checks, e.g. "mlp 784-700-500-10"
    variables: Tuple[Variable, ...]
    # (variables by name, inputs [N, *input_shape]: float inputs in the variables' dtype, integer ones as they
    # are[, context: shared.model.ForwardContext for dropout, running statistics and taps]) -> logits
    # [N, *label_shape, classes]
    forward: Callable[..., tf.Tensor]
    flops_per_example: int  # forward + backward, for the GFLOP/s figure
    sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)  # the named dimensions of `shape`s
    paddable: FrozenSet[str] = frozenset()  # named sizes that zero units may extend: they compute 0 and stay 0
    description: str = ""  # one line for the header
    # How messages group state names ("every variable and Adam slot"): (names, all names) -> text.
    summarise_state: Callable[[Sequence[str], Sequence[str]], str] = summarise_named_state
    input_shape: Tuple[int, ...] = (784,)  # one example's input: MNIST flattened; (28, 28, 1) images; (64,) tokens
    input_dtype: str = "float32"  # "float32" (widened in a float64 run) or an integer dtype ("int32" tokens)
    # One example's labels: () one class; (64,) one per token. "binary" and "values" targets: the output's shape
    # without the batch, (1,) for one unit.
    label_shape: Tuple[int, ...] = ()
    classes: int = 10  # logits per label; labels are 0..classes-1, or negative for a label that does not count
    targets: str = "classes"  # what a label is: one of TARGETS
    # "classes": (logits [..., classes], labels [...] with masked ones set to 0) -> the loss of every label [...];
    # None: softmax cross-entropy. "binary" and "values": (outputs [N, *label_shape], targets of that shape) -> the
    # loss of every example (and position) [N, *label_shape[:-1]]; None: the mean squared error over the last axis.
    # Every trainer sums it over the global batch's counted labels and divides by their global count
    # (shared/training/losses.py), so it must not average over the batch itself.
    loss: Optional[Callable[[tf.Tensor, tf.Tensor], tf.Tensor]] = None
    # "binary" targets: an output above it predicts 1, for the accuracy (0 for logits, 0.5 for probabilities).
    binary_threshold: float = 0.0
    # One line for the header and the report on what trains besides the forward: the loss (when it is not the
    # definition's own hook alone), the model's own losses, the optimizer its compile settings asked for; "" none.
    objective: str = ""
    # The optimizer the model asks for (a compiled Keras Adam or SGD, its hyperparameters and schedule): it trains
    # instead of --optimizer and --learning-rate; None: those.
    optimizer: Optional[OptimizerChoice] = None
    default_data: str = "mnist"  # what --data auto/tfds/embedded load: "mnist" or "tiny_shakespeare"
    # Integer inputs: the token ids the model takes, 0..vocabulary-1 (its embedding's rows); data is checked against
    # it before anything trains (a token beyond it fails inside every trainer on a CPU and reads zeros on a GPU).
    # Float inputs: None.
    vocabulary: Optional[int] = None
    cautions: Tuple[Caution, ...] = ()  # what will differ and why, said before anything trains
    # (final weights in the definition's order, a path) -> the model in its own format there (a Keras model's .keras
    # file, beside an export's SavedModel); None: the model has no other format
    save_as: Optional[Callable[[Sequence[np.ndarray], str], None]] = None
    # A Keras definition's built Keras model itself (shared/model/keras.py), with its compile settings if the user's
    # function compiled it: what --fit trains with Keras's own model.fit (shared/training/keras_fit.py); None else.
    keras_model: Optional[object] = None
    # Each example's outputs depend on its own inputs alone (no batch statistics): DTensor may then pad a short batch
    # to the full batch's shape, one traced step for every batch (dtensor_impl/inputs.py). Off unless a definition
    # says so (a Keras model's is off).
    independent_examples: bool = False
    # A Keras model's LayoutMap, audited (shared/model/keras_layouts.py LayoutAudit): which key laid out which
    # variable, the keys that matched none; None for a model without one.
    layout_audit: Optional[object] = None
    # A model of several named inputs (shared/model/named_inputs.py): each one's shape, dtype and vocabulary; its
    # forward takes a dict {name: [N, *shape]} and its data one array per input. input_shape and input_dtype are
    # then its first input's. (): one input, input_shape and input_dtype.
    inputs: Tuple[NamedInput, ...] = ()
    # Under a mixed policy the forward is given the float32 weights and inputs and casts them itself (a Keras model's
    # dtype policy: its layers autocast, and a BatchNormalization's moving statistics stay float32); False: the
    # Model hands it both in the compute dtype.
    casts_itself: bool = False
    # (a --dtype) -> None: makes what the forward computes in that dtype with, before anything traces (a Keras
    # model's copy under a mixed policy: shared/model/keras.py Computes); None: nothing to make.
    prepare_dtype: Optional[Callable[[str], None]] = None

    def shape(self, variable: Variable, sizes: Optional[Mapping[str, int]] = None) -> Tuple[int, ...]:
        sizes = self.sizes if sizes is None else sizes
        return tuple(sizes[dim] if isinstance(dim, str) else dim for dim in variable.shape)

    @property
    def output_shape(self) -> Tuple[int, ...]:
        """One example's output: [*label_shape, classes] logits for class targets, else the labels' own shape."""
        return (*self.label_shape, self.classes) if self.targets == "classes" else tuple(self.label_shape)

    @property
    def has_accuracy(self) -> bool:
        """Whether the labels are classes (ids or binary) that an accuracy counts; a regression has none."""
        return self.targets != "values"

    @property
    def loss_name(self) -> str:
        if self.loss is not None:
            return getattr(self.loss, "__name__", "the model's loss")
        return "softmax cross-entropy" if self.targets == "classes" else "mean squared error"

    @property
    def names(self) -> List[str]:
        return [variable.name for variable in self.variables]

    @property
    def labels(self) -> List[str]:
        return [variable.label or variable.name for variable in self.variables]

    @property
    def trainable_variables(self) -> Tuple[Variable, ...]:
        """The variables the optimizer steps (not the running statistics), in order."""
        return tuple(variable for variable in self.variables if variable.trainable)

    @property
    def has_running_statistics(self) -> bool:
        return len(self.trainable_variables) < len(self.variables)

    @property
    def trainable_labels(self) -> List[str]:
        return [variable.label or variable.name for variable in self.trainable_variables]

    @functools.cached_property  # Model.__call__ asks on every forward; the signature is read once
    def takes_context(self) -> bool:
        return takes_context(self.forward)

    def parameter_count(self) -> int:
        return sum(int(np.prod(self.shape(variable))) for variable in self.variables)

    def initial_values(self, seed: int, dtype: str = "float32") -> List[np.ndarray]:
        """Every variable's initial value, drawn once in float32 from `seed`; "float64" widens those
        numbers exactly, so both precisions train the same model from the same start."""
        values = []
        for variable in self.variables:
            value = np.asarray(variable.init(self.shape(variable), seed), np.float32)
            if value.shape != self.shape(variable):
                raise UsageError(
                    f"model {self.name}: variable {variable.name}'s initializer gave shape "
                    f"{value.shape}, not {self.shape(variable)}; fix its init"
                )
            values.append(value.astype(dtype))
        return values

    def split_sizes(self, model_axis: Optional[int]) -> Dict[str, int]:
        """The named sizes, each that `model_axis` splits and does not divide padded up to a multiple of it;
        UsageError for a size that may not be padded."""
        return self.padded_sizes([variable.layout for variable in self.variables], {MODEL_AXIS: model_axis or 1})

    def padded_sizes(self, layouts: Sequence[Sequence[str]], axis_sizes: Mapping[str, int]) -> Dict[str, int]:
        """The named sizes when each variable is laid out as `layouts` says (an axis per dimension) on a mesh of
        `axis_sizes` (axes it does not name split nothing): a size that an axis splits and does not divide is
        padded to a multiple of every axis that splits it; UsageError for one the model may not pad."""
        needed: Dict[str, int] = {}
        for variable, layout in zip(self.variables, layouts, strict=True):
            for dim, axis in enumerate(layout):
                count = axis_sizes.get(axis, 1)
                if count == 1:
                    continue
                size = variable.shape[dim]
                length = self.sizes[size] if isinstance(size, str) else size
                if length % count and size not in self.paddable:
                    divisors = ", ".join(str(d) for d in range(1, length + 1) if length % d == 0)
                    raise UsageError(
                        f"model {self.name}: variable {variable.name} dimension {dim} ({length}) does not "
                        f"divide over the {axis} axis of {count}, and the model allows no padding "
                        f"for it; use a {axis} axis of {divisors}{self._unsharded_hint(variable.name, dim)}"
                    )
                if isinstance(size, str):  # a multiple of every axis that splits it: divides, or zero units pad it
                    needed[size] = math.lcm(needed.get(size, 1), count)
        return {name: -(-length // needed.get(name, 1)) * needed.get(name, 1) for name, length in self.sizes.items()}

    def _unsharded_hint(self, name: str, dim: int) -> str:
        """For a variable a LayoutMap key laid out: the key to change, as a second fix."""
        key = self.layout_audit.key_for(name) if self.layout_audit is not None else None
        return f", or None for dimension {dim} in LayoutMap key {key!r}" if key is not None else ""

    def pad(self, values: Sequence[np.ndarray], sizes: Mapping[str, int]) -> List[np.ndarray]:
        """`values` zero-padded at the end of every dimension whose named size `sizes` makes larger."""
        return [
            np.pad(value, [(0, want - have) for want, have in zip(self.shape(variable, sizes), value.shape)])
            for variable, value in zip(self.variables, values, strict=True)
        ]

    def unpad(self, arrays: Sequence[np.ndarray], variables: Optional[Sequence[Variable]] = None) -> List[np.ndarray]:
        """Padded values or gradients of `variables` (default: all) cut back to their own shapes."""
        return [
            np.asarray(array)[tuple(slice(0, size) for size in self.shape(variable))]
            for variable, array in zip(self.variables if variables is None else variables, arrays, strict=True)
        ]


class Model(tf.Module):
    """One set of a definition's variables and its forward pass: `model(images)`, `model.weights`.

    `make_variable(value, variable)` makes each one: tf.Variable (the default; under a strategy
    scope a MirroredVariable) or a DVariable in its layout. They are attributes along their names,
    so a checkpoint's keys are model/<name> whichever trainer wrote it.
    """

    def __init__(
        self,
        definition: ModelDefinition,
        values: Sequence[np.ndarray],
        make_variable=None,
        gather=None,
        seed: int = 0,
        output=None,
        compute_dtype: Optional[str] = None,
    ):
        super().__init__()
        self.definition = definition
        # A mixed policy's (Config.compute_dtype): the forward reads its weights and inputs cast to it and hands back
        # float32 logits, so the loss and every gradient of a weight are float32; None: the weights' own dtype.
        self.compute_dtype = compute_dtype
        self.seed = seed  # the run's: what dropout's numbers are drawn from (shared/model/forward.py)
        # gather(weight, variable) -> the value the forward computes with (DTensor: a weight split on the batch
        # axis, all-gathered there, as FSDP does); None: the weight itself.
        self._gather = gather
        # output(logits) -> what every caller (loss, accuracy, serving) gets (DTensor: the classes relaid out whole,
        # dtensor_impl/classes.py); None: the forward's logits.
        self._output = output
        make_variable = make_variable or (lambda value, variable: tf.Variable(value, trainable=variable.trainable))
        tree: dict = {}
        for variable, value in zip(definition.variables, values, strict=True):
            *path, leaf = variable.name.split("/")
            node = tree
            for part in path:
                node = node.setdefault(part, {})
            node[leaf] = make_variable(value, variable)
        for key, node in tree.items():
            setattr(self, key, _trackable(node))

    @property
    def weights(self) -> list:
        """The variables in the definition's order (tf.Module's `variables` sorts by name instead)."""
        found = []
        for name in self.definition.names:
            node = self
            for part in name.split("/"):
                node = node[int(part)] if part.isdigit() else getattr(node, part)
            found.append(node)
        return found

    @property
    def trainable(self) -> list:
        """The variables the optimizer steps, in the definition's order (not the running statistics)."""
        return [weight for weight, variable in zip(self.weights, self.definition.variables) if variable.trainable]

    def __call__(self, inputs, context: Optional[ForwardContext] = None):
        weights = self.weights
        if self._gather is not None:
            weights = [self._gather(weight, variable) for weight, variable in zip(weights, self.definition.variables)]
        compute = tf.as_dtype(self.compute_dtype or weights[0].dtype)
        cast = not (self.compute_dtype is not None and self.definition.casts_itself)
        if compute != weights[0].dtype and cast:  # the cast's gradient is the float32 gradient of the weight
            weights = [tf.cast(weight, compute) if weight.dtype.is_floating else weight for weight in weights]
        if self.definition.inputs:  # several named inputs: each float one widened as one input is
            inputs = {name: widened(value, compute) for name, value in inputs.items()} if cast else inputs
        elif tf.as_dtype(inputs.dtype).is_floating and cast:  # float32 inputs into a float64 model: widened exactly
            inputs = tf.cast(inputs, compute)
        named = dict(zip(self.definition.names, weights))
        if self.definition.takes_context:
            context = context or ForwardContext()
            context.compute_dtype = tf.as_dtype(compute)
            logits = self.definition.forward(named, inputs, context)
        else:
            logits = self.definition.forward(named, inputs)
        if self.compute_dtype is not None:
            logits = tf.cast(logits, tf.float32)  # the loss in float32
        return logits if self._output is None else self._output(logits)

    def training_context(self, step, positions, record: bool = False, loss_scale=None) -> ForwardContext:
        """The context of a training step: the run's seed, the optimizer's step before the update, each example's
        position in the global batch; `loss_scale`: mixed_float16's (shared/training/loss_scale.py), else None."""
        context = ForwardContext(training=True, seed=self.seed, step=step, positions=positions, record=record)
        context.loss_scale = loss_scale
        return context

    def apply_updates(self, context: ForwardContext, relayout=None) -> None:
        """Assign the running statistics the forward asked for (`relayout(value, variable)`: into its layout)."""
        by_name = dict(zip(self.definition.names, self.weights))
        trainable = {variable.name for variable in self.definition.trainable_variables}
        for name, value in context.updates.items():
            if name not in by_name or name in trainable:
                raise ValueError(f"context.update({name!r}): the model has no non-trainable variable {name}")
            target = by_name[name]
            target.assign(relayout(value, target) if relayout else tf.cast(value, target.dtype))


def widened(value, compute):
    """A float input cast to the dtype the forward computes in; an integer one (token ids, a mask) as it is."""
    return tf.cast(value, compute) if tf.as_dtype(value.dtype).is_floating else value


def _trackable(node):
    """A name tree as tf.Module attributes: digit keys 0..n-1 become a list, others a sub-module."""
    if not isinstance(node, dict):
        return node
    if all(key.isdigit() for key in node) and sorted(map(int, node)) == list(range(len(node))):
        return [_trackable(node[str(index)]) for index in range(len(node))]
    module = tf.Module()
    for key, child in node.items():
        setattr(module, key, _trackable(child))
    return module


def check_definition(definition, source: str) -> ModelDefinition:
    """UsageError in one line, naming the variable, for a definition no trainer could build."""
    if not isinstance(definition, ModelDefinition):
        raise UsageError(
            f"--model {source} returned {type(definition).__name__}; return a Keras model, a (Keras model, LayoutMap) "
            f"pair or a dtensor_vs_mirrored.shared.model.ModelDefinition"
        )
    if not definition.variables:
        raise UsageError(f"--model {source}: the model has no variables")
    _check_example(definition, source)
    seen = set()
    for variable in definition.variables:
        _check_variable(definition, variable, source, seen)
    return definition


def _check_example(definition: ModelDefinition, source: str) -> None:
    """What one example is: its input's shape and dtype (and vocabulary), its labels' shape, the classes, the data."""
    if definition.inputs:
        check_inputs(definition.inputs, source)
    spec = (definition.input_shape, definition.label_shape)
    if not all(isinstance(size, int) and size > 0 for shape in spec for size in shape) or not definition.input_shape:
        raise UsageError(
            f"--model {source}: input_shape {list(definition.input_shape)} and label_shape "
            f"{list(definition.label_shape)} must be positive ints (one example's, without the batch)"
        )
    if definition.input_dtype not in INPUT_DTYPES:
        raise UsageError(
            f"--model {source}: input_dtype {definition.input_dtype!r}: use one of {', '.join(INPUT_DTYPES)}"
        )
    _check_targets(definition, source)
    tokens = definition.input_dtype.startswith("int") and not definition.inputs  # several: each input's own
    if tokens != (definition.vocabulary is not None) or (
        tokens and (not isinstance(definition.vocabulary, int) or definition.vocabulary < 1)
    ):
        raise UsageError(
            f"--model {source}: input_dtype {definition.input_dtype} with vocabulary {definition.vocabulary!r}: "
            + (
                "integer inputs are token ids; declare vocabulary=N, the number of ids (0..N-1) the model takes"
                if tokens
                else "float inputs have no vocabulary; drop it"
            )
        )
    if definition.default_data not in DEFAULT_DATA:
        raise UsageError(f"--model {source}: default_data {definition.default_data!r}: use {' or '.join(DEFAULT_DATA)}")


def _check_targets(definition: ModelDefinition, source: str) -> None:
    """What a label is: class ids of 2 classes or more, or binary or float targets of at least one output unit."""
    if definition.targets not in TARGETS:
        raise UsageError(f"--model {source}: targets {definition.targets!r}: use one of {', '.join(TARGETS)}")
    if definition.targets == "classes":
        if not isinstance(definition.classes, int) or definition.classes < 2:
            raise UsageError(
                f"--model {source}: classes {definition.classes!r} with class targets ({definition.loss_name}): "
                f"a class id needs 2 classes or more; for one output unit declare targets='binary' or 'values'"
            )
    elif not definition.label_shape:
        raise UsageError(
            f"--model {source}: {definition.targets} targets with label_shape []: give the output's shape without "
            f"the batch, (1,) for one unit"
        )


def _check_variable(definition: ModelDefinition, variable: Variable, source: str, seen: set) -> None:
    """A variable's name (one of the `seen` names so far: a second definition), named dimensions and layout."""
    parts = variable.name.split("/")
    if not all(NAME_PART.match(part) for part in parts) or parts[0] in RESERVED_NAMES or parts[0].isdigit():
        raise UsageError(
            f"--model {source}: variable name {variable.name!r} must be '/'-separated identifiers "
            f"or indices, not starting with an index or one of {', '.join(sorted(RESERVED_NAMES))}"
        )
    if variable.name in seen:
        raise UsageError(f"--model {source}: variable {variable.name} is defined twice")
    seen.add(variable.name)
    unknown = [dim for dim in variable.shape if isinstance(dim, str) and dim not in definition.sizes]
    if unknown:
        raise UsageError(
            f"--model {source}: variable {variable.name} has dimension {unknown[0]!r}, which the "
            f"model's sizes do not name"
        )
    if variable.layout and len(variable.layout) != len(variable.shape):
        raise UsageError(
            f"--model {source}: variable {variable.name} has a layout of rank {len(variable.layout)} "
            f"{list(variable.layout)} for its shape of rank {len(variable.shape)} "
            f"{list(definition.shape(variable))}; give one entry per dimension"
        )
    wrong = [axis for axis in variable.layout if axis not in (*MESH_AXES, UNSHARDED)]
    if wrong or any(variable.layout.count(axis) > 1 for axis in MESH_AXES):
        raise UsageError(
            f"--model {source}: variable {variable.name} has layout {list(variable.layout)}; use "
            f"'{MODEL_AXIS}' and '{BATCH_AXIS}' each on at most one dimension and '{UNSHARDED}' on the others"
        )
