"""A Keras 3 model as a ModelDefinition: what `--model FILE.py:FUNCTION` makes of a function that returns a built
`keras.Model`, or `(model, keras.distribution.LayoutMap)`.

    python compare.py --model examples/keras_cnn.py:keras_cnn --data images.npz --devices 4 --dtype float64

The variables are the model's, named by their Keras paths, from the values it was built with (after
`keras.utils.set_random_seed(--seed)`), laid out by the user's LayoutMap itself (`layout_map[path]`: their Keras
version's matching). The forward is Keras's own pure one, `model.stateless_call`; the non-trainable values it
returns (BatchNormalization's moving statistics) are `context.update`s. Keras seed states are not variables here:
a step's is (the layer's initial seed, the optimizer step). A float64 run computes with a copy rebuilt from the
model's config with every float32 dtype float64, from the float32 values widened. docs/keras.md.
"""

import re
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from dtensor_vs_mirrored.shared.config import MIXED_COMPUTE
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.model import keras_compat
from dtensor_vs_mirrored.shared.model.definition import (
    BATCH_AXIS,
    MESH_AXES,
    MODEL_AXIS,
    NAME_PART,
    RESERVED_NAMES,
    UNSHARDED,
    Caution,
    ModelDefinition,
    Variable,
)
from dtensor_vs_mirrored.shared.model.keras_depthwise import convolution_cautions
from dtensor_vs_mirrored.shared.model.keras_downcasts import float64_in_code, keeping_float64
from dtensor_vs_mirrored.shared.model.keras_inputs import embedding_vocabulary, keras_arrangement, keras_inputs
from dtensor_vs_mirrored.shared.model.keras_layouts import audit_layout_map, check_keys
from dtensor_vs_mirrored.shared.model.keras_objective import objective_fields, output_cautions
from dtensor_vs_mirrored.shared.model.keras_tied import calls_nested_layers, tied_copy
from dtensor_vs_mirrored.shared.model.named_inputs import describe_inputs, zeros_for
from dtensor_vs_mirrored.shared.model.quiet_profiler import profiler_deprecations_dropped

SEED_STRIDE = 1 << 16  # a seed state's counter advances this much a step: room for that many draws of one state
RATES = ("rate", "dropout", "recurrent_dropout")  # a random layer's rates: all 0, it draws nothing
RANDOM_LAYER_HINT = (
    "use dtensor_vs_mirrored.shared.model.keras_layers.Dropout, which draws alike everywhere, or where the layer is "
    "not yours build it with a rate of 0 (a keras-hub backbone's dropout=0) (docs/keras.md)"
)


def is_keras_model(result) -> bool:
    """Whether a --model function returned a Keras model (any Keras, so that Keras 2 is refused by name), or a
    pair (model, layout map). Imports no Keras."""
    candidate = result[0] if isinstance(result, tuple) and len(result) == 2 else result
    return any(
        cls.__module__.split(".")[0] in ("keras", "tf_keras") and cls.__name__ in ("Model", "Layer")
        for cls in type(candidate).__mro__
    )


def prepare_keras(seed: int) -> bool:
    """Before a user's function builds a Keras model: Keras's name counters cleared (so layer names, and so
    variable paths, are the same in every process) and its seeds set; False where no Keras 3 is imported."""
    keras = sys.modules.get("keras")
    if keras is None or keras_compat.major_version(keras) < 3:
        return False
    keras.utils.clear_session(free_memory=False)
    keras.utils.set_random_seed(seed)
    return True


def keras_2_hint() -> str:
    """What to add to a user's file's error when the Keras it imported is Keras 2 (TensorFlow 2.12-2.15): a model
    written for Keras 3 fails there on the first name Keras 2 lacks; "" otherwise."""
    keras = sys.modules.get("keras")
    version = getattr(keras, "__version__", "")
    if keras is None or not 0 < keras_compat.major_version(keras) < 3:
        return ""
    return (
        f"; this is Keras {version} (TensorFlow {tf.__version__} brings Keras 2), and Keras models need Keras 3: "
        f"use TensorFlow 2.16 or later (pip install 'tensorflow>=2.16')"
    )


def check_keras(source: str):
    """Keras 3 on the TensorFlow backend, or UsageError in one line that says which release to use."""
    import keras

    if keras_compat.major_version(keras) < 3:
        raise UsageError(
            f"--model {source}: the model is Keras {keras.__version__} (TensorFlow {tf.__version__} brings Keras 2); "
            f"Keras models need Keras 3: use TensorFlow 2.16 or later (pip install 'tensorflow>=2.16')"
        )
    if keras.backend.backend() != "tensorflow":
        raise UsageError(
            f"--model {source}: Keras runs on {keras.backend.backend()}; set KERAS_BACKEND=tensorflow to train it here"
        )
    return keras


def keras_definition(result, source: str) -> ModelDefinition:
    """A built Keras model, or (model, layout_map), as a definition every trainer trains; UsageError in one line
    for one they could not."""
    keras = check_keras(source)
    model, layout_map = checked_model(result, source, keras)
    check_keys(layout_map, source)
    inputs = keras_inputs(model, keras, source)  # several named inputs; (): one
    input_shape, input_dtype = (inputs[0].shape, inputs[0].dtype) if inputs else input_spec(model, source, keras)
    arrange = keras_arrangement(model)  # a dict of named inputs as Keras takes them
    probe = arrange(zeros_for(inputs, 2)) if inputs else tf.zeros((2, *input_shape), input_dtype)
    outputs = model(probe, training=False)
    if not tf.is_tensor(outputs) or outputs.shape.rank < 2:
        raise UsageError(
            f"--model {source}: the model returns {describe_outputs(outputs)}; it must return one tensor of logits "
            f"[N, ..., classes]"
        )
    trainable, state = list(model.trainable_variables), list(model.non_trainable_variables)
    running = [index for index, variable in enumerate(state) if is_float(variable)]
    keras_variables = trainable + [state[index] for index in running]
    names = variable_names([variable.path for variable in keras_variables])
    parameters = int(sum(np.prod(variable.shape) for variable in keras_variables))
    forward, notes, computes = stateless_forward(model, keras, source, names, state, running, probe, arrange)
    return ModelDefinition(
        name=f"keras {model.name} {parameters} parameters",
        variables=definition_variables(keras_variables, names, layout_map, source),
        forward=forward,
        flops_per_example=flops_per_example(model, probe, parameters),
        description="; ".join([describe(model, layout_map, inputs), *notes]),
        input_shape=input_shape,
        input_dtype=input_dtype,
        inputs=inputs,
        **objective_fields(model, keras, outputs, source),  # targets, labels and loss: the compiled ones
        vocabulary=None if inputs else vocabulary(model, keras, input_dtype, source),
        default_data=default_data(input_shape, input_dtype, tuple(outputs.shape[1:-1])),
        cautions=cautions(model, keras),
        save_as=keras_saver(model, keras_variables, keras),
        keras_model=model,
        layout_audit=None if layout_map is None else audit_layout_map(layout_map, keras, keras_variables, names),
        casts_itself=True,  # its layers' dtype policies cast the float32 weights and inputs
        prepare_dtype=computes.prepare,
    )


def checked_model(result, source: str, keras):
    """(model, layout_map or None) of what the user's function returned; UsageError in one line for what no
    trainer could train: Keras 2, not a model, not a LayoutMap, not built, not float32."""
    model, layout_map = result if isinstance(result, tuple) else (result, None)
    if type(model).__module__.startswith("tf_keras"):
        raise UsageError(
            f"--model {source}: the model is tf_keras (Keras 2); build it with Keras 3: import keras, and unset "
            f"TF_USE_LEGACY_KERAS"
        )
    if not isinstance(model, keras.Model):
        raise UsageError(f"--model {source}: returned a {type(model).__name__}; return a keras.Model")
    if layout_map is not None and not isinstance(layout_map, keras.distribution.LayoutMap):
        raise UsageError(
            f"--model {source}: the pair's second item is a {type(layout_map).__name__}; give a "
            f"keras.distribution.LayoutMap (or return the model alone)"
        )
    if not model.built:
        raise UsageError(
            f"--model {source}: the Keras model {model.name} is not built; start it with keras.Input(shape), or "
            f"call it once on an example batch"
        )
    check_float32(model, source)
    return model, layout_map


def definition_variables(keras_variables, names, layout_map, source: str):
    """The definition's Variables: each Keras variable's values, its layout from the LayoutMap, its path."""
    layouts = [layout_for(layout_map, variable, source) for variable in keras_variables]
    return tuple(
        Variable(
            name,
            tuple(variable.shape),
            init=constant(variable.numpy()),
            layout=layout,
            label=variable.path if variable.path != name else "",
            trainable=variable.trainable,
        )
        for name, variable, layout in zip(names, keras_variables, layouts, strict=True)
    )


def stateless_forward(model, keras, source: str, names, state, running, probe, arrange):
    """(the definition's forward, what the header says of it, the Computes it reads): the model's stateless_call
    (or its copy's in the run's dtype) on the trainer's values (its inputs as `arrange` makes them), the running
    statistics' new values handed to context.update, each seed state drawn from the context, Keras's other
    non-float bookkeeping (an adapted Normalization's count) carried as it is."""
    from dtensor_vs_mirrored.shared.model.keras_compute import call_stateless

    computed, notes = unrolled_copy(model, keras, source, probe)
    computes = Computes(computed, keras, source, probe)
    notes += computes.notes()
    kept = [(index, state[index], state[index].numpy()) for index in range(len(state)) if index not in running]
    trainable_count = len(names) - len(running)  # `names`: the trainable variables', then the running statistics'
    trainable_names, running_names = names[:trainable_count], names[trainable_count:]

    def forward(values, inputs, context):
        compute = computes.get(run_dtype(context.compute_dtype))  # the model, or its copy in the run's dtype
        non_trainable = dict(zip(running, (values[name] for name in running_names)))
        non_trainable.update((index, kept_state(variable, value, context)) for index, variable, value in kept)
        weights = [values[name] for name in trainable_names]
        with keeping_float64(computes.keeps_float64(compute)):  # float32 in the layers' code, in a float64 run
            logits, new_state = call_stateless(
                compute, weights, [non_trainable[i] for i in range(len(state))], arrange(inputs), context
            )
        for name, index in zip(running_names, running, strict=True):
            context.update(name, new_state[index])
        return logits

    return forward, notes, computes


def run_dtype(compute_dtype) -> str:
    """The --dtype whose forward computes in `compute_dtype`: bfloat16 -> mixed_bfloat16, float32 -> float32."""
    name = tf.as_dtype(compute_dtype).name
    return next((policy for policy, compute in MIXED_COMPUTE.items() if compute == name), name)


class Computes:
    """The Keras model each --dtype computes with: the model as it is for its own policy (own_policy), else a copy
    rebuilt with every layer under the run's dtype, holding its values. float32 and float64 are made with the
    definition; a mixed one by `prepare`, when a run asks for it (definition_for: before anything traces, and never
    where a CPU's kernels cannot compute its dtype's matmul: shared/run/kernels.py)."""

    def __init__(self, model, keras, source: str, probe):
        from dtensor_vs_mirrored.shared.model.keras_compute import compute_for

        self.model, self.keras, self.source, self.probe = model, keras, source, probe
        self.own = own_policy(model)
        self.made = {self.own: compute_for(model, probe)}
        self.keeps_casts, self.float64_notes = False, []  # the float64 copy's casts kept float64 (keras_downcasts.py)
        for dtype in ("float32", "float64"):
            self.prepare(dtype)

    def prepare(self, dtype: str) -> None:
        from dtensor_vs_mirrored.shared.model.keras_compute import compute_for

        if dtype in self.made:
            return
        copy = copy_in(self.model, self.keras, self.source, dtype)
        if dtype == "float64":  # so that a float64 run rounds nothing to float32
            self.keeps_casts, self.float64_notes = float64_in_code(copy, self.probe)
        self.made[dtype] = compute_for(copy, self.probe)

    def keeps_float64(self, compute) -> bool:
        """Whether `compute` (one of made's) computes with keeping_float64: the float64 copy, where it can."""
        return self.keeps_casts and compute is self.made.get("float64")

    def get(self, dtype: str):
        if dtype not in self.made:
            raise RuntimeError(f"the Keras model's {dtype} copy was not prepared (definition_for prepares it)")
        return self.made[dtype]

    def notes(self) -> List[str]:
        """What the header's model line says: untapped copies, and a mixed model's policy."""
        found = self.float64_notes + sorted({compute.untapped for compute in self.made.values() if compute.untapped})
        if self.own != "float32":
            found.append(
                f"layers under {self.own} (--dtype {self.own} trains it as it is; another --dtype, a copy rebuilt "
                f"with every layer under it)"
            )
        return found


def kept_state(variable, initial: np.ndarray, context) -> tf.Tensor:
    """A non-float Keras variable in this forward: a seed state drawn from the step (seed_state), any other (an
    adapted Normalization's count) its value, as it is: Keras's bookkeeping, neither trained nor judged."""
    return seed_state(initial, context) if is_seed_state(variable) else tf.constant(initial)


def seed_state(initial: np.ndarray, context) -> tf.Tensor:
    """A Keras seed state in this forward: its initial [seed, counter], the counter moved on by the optimizer step
    (a training step draws from its own state, as Keras's counter would; the same on every trainer)."""
    state = tf.constant(np.asarray(initial, np.int64), tf.int64)
    if not context.training or context.step is None:
        return state
    return state + tf.stack([tf.constant(0, tf.int64), tf.cast(context.step, tf.int64) * SEED_STRIDE])


def input_spec(model, source: str, keras) -> Tuple[Tuple[int, ...], str]:
    """One example's input shape and dtype: a functional or Sequential model's Input, a subclassed model's build
    shape (and subclassed_input_dtype)."""
    inputs = getattr(model, "inputs", None) if not is_subclassed(model) else None
    if inputs is not None and len(inputs) != 1:
        raise UsageError(f"--model {source}: the model takes {len(inputs)} inputs; it must take one tensor per example")
    if inputs:
        shape, dtype = tuple(inputs[0].shape[1:]), str(inputs[0].dtype)
    else:
        build = (model.get_build_config() or {}).get("input_shape")
        if not build or not all(isinstance(size, (int, type(None))) for size in build):
            raise UsageError(
                f"--model {source}: the Keras model {model.name} was built from {build!r}; build it from one "
                f"input: keras.Input(shape), or call it once on an example batch"
            )
        shape, dtype = tuple(build[1:]), subclassed_input_dtype(model, keras)
    if not shape or not all(isinstance(size, int) for size in shape):
        raise UsageError(
            f"--model {source}: the model's input is [N, {', '.join(str(size) for size in shape)}]; give every "
            f"dimension but the batch's a size (keras.Input(shape=(32, 32, 3)))"
        )
    if dtype not in ("float32", "int32", "int64"):
        raise UsageError(f"--model {source}: the model's input is {dtype}; use float32, int32 or int64 inputs")
    return shape, dtype


def subclassed_input_dtype(model, keras) -> str:
    """What Keras knows of a subclassed model's inputs (its build config holds only their shape): the dtype of an
    input_spec it was given, int32 token ids when its first layer is an Embedding, else float32."""
    spec = model.input_spec[0] if isinstance(model.input_spec, list) else model.input_spec
    if getattr(spec, "dtype", None):
        return str(spec.dtype)
    first = model.layers[0] if model.layers else None
    return "int32" if isinstance(first, keras.layers.Embedding) else "float32"


def vocabulary(model, keras, input_dtype: str, source: str) -> Optional[int]:
    """Integer inputs: the token ids the model takes (data is checked against it before anything trains), the
    input_dim of the Embedding nearest its input in its graph (embedding_vocabulary), or of its first Embedding
    where it has no graph (a subclassed model); None for float inputs."""
    if not input_dtype.startswith("int"):
        return None
    graph_inputs = getattr(model, "inputs", None) if not is_subclassed(model) else None
    nearest = embedding_vocabulary(graph_inputs[0], keras) if graph_inputs else None
    if nearest is not None:
        return nearest
    layers = keras_compat.flat_layers(model)
    embedding = next((layer for layer in layers if isinstance(layer, keras.layers.Embedding)), None)
    if embedding is None:
        raise UsageError(
            f"--model {source}: the model takes {input_dtype} inputs but has no Embedding layer to say how many token "
            f"ids it takes; embed the ids with keras.layers.Embedding, or take float inputs"
        )
    return int(embedding.input_dim)


def default_data(input_shape, input_dtype: str, label_shape) -> str:
    """What --data auto/tfds/embedded load for it: tiny Shakespeare for a language model (token ids in, a label for
    every position out: the next character), MNIST else."""
    language_model = input_dtype.startswith("int") and len(input_shape) == 1 and tuple(label_shape) == input_shape
    return "tiny_shakespeare" if language_model else "mnist"


def is_subclassed(model) -> bool:
    return type(model).__name__ not in ("Functional", "Sequential") and not keras_compat.has_graph(model)


def describe_outputs(outputs) -> str:
    if tf.is_tensor(outputs):
        return f"shape {list(outputs.shape)}"
    return f"{type(outputs).__name__} of {len(outputs)} outputs" if hasattr(outputs, "__len__") else str(outputs)


def check_float32(model, source: str) -> None:
    """Every float variable float32 (the tool widens them for float64; Keras's non-float bookkeeping, a seed state or
    an adapted Normalization's count, is carried as it is), every layer computing in its variables' dtype or under
    one mixed policy (own_policy)."""
    for variable in model.variables:
        if is_float(variable) and variable.dtype != "float32":
            raise UsageError(
                f"--model {source}: variable {variable.path} is {variable.dtype}; build the model in float32 "
                f"(--dtype float64 trains a float64 copy of it)"
            )
    policies = layer_policies(model)
    other = [(name, policy) for name, policy in policies.items() if policy not in POLICIES]
    if other:
        name, policy = other[0]
        raise UsageError(
            f"--model {source}: layer {name} has the dtype policy {policy}; the tool trains float32 weights "
            f"computing in float32 or under mixed_bfloat16 or mixed_float16: use one of those"
        )
    mixed = sorted(set(policies.values()) - {"float32"})
    if len(mixed) > 1:
        names = [next(name for name, policy in policies.items() if policy == kind) for kind in mixed]
        raise UsageError(
            f"--model {source}: layers {names[0]} and {names[1]} compute under {mixed[0]} and {mixed[1]}; give "
            f"every mixed layer one policy"
        )


POLICIES = ("float32", *MIXED_COMPUTE)  # the dtype policies a layer may have: float32 weights


def layer_policies(model) -> Dict[str, str]:
    """Each layer's dtype policy name (the model's own too; its Input's is its inputs' dtype, left out)."""
    return {
        layer.name: layer.dtype_policy.name
        for layer in [*keras_compat.flat_layers(model), model]
        if type(layer).__name__ != "InputLayer" and getattr(layer, "dtype_policy", None) is not None
    }


def own_policy(model) -> str:
    """The --dtype that trains `model` as it is: its layers' mixed policy (some layers may stay float32, an output
    layer as Keras's guide keeps it), else float32."""
    mixed = set(layer_policies(model).values()) - {"float32"}
    return mixed.pop() if mixed else "float32"


def is_float(variable) -> bool:
    return tf.as_dtype(variable.dtype).is_floating


def is_seed_state(variable) -> bool:
    return variable.path.split("/")[-1] == "seed_generator_state"


def variable_names(paths: Sequence[str]) -> List[str]:
    """Keras paths as the definition's names: each part an identifier (other characters become _), never a name
    tf.Module keeps for itself first."""
    names = []
    for path in paths:
        parts = [part if NAME_PART.match(part) else re.sub(r"\W", "_", part) for part in path.split("/")]
        parts = [f"_{part}" if not NAME_PART.match(part) else part for part in parts]
        if parts[0] in RESERVED_NAMES or parts[0].isdigit():
            parts[0] = f"keras_{parts[0]}"
        names.append("/".join(parts))
    return names


def constant(value: np.ndarray):
    value = np.asarray(value, np.float32)
    return lambda shape, seed: value


def layout_for(layout_map, variable, source: str) -> Tuple[str, ...]:
    """The variable's layout from the user's LayoutMap (`layout_map[path]`), as the definition's: an axis or
    "unsharded" per dimension, () when no key matches."""
    if layout_map is None:
        return ()
    try:
        found = layout_map[variable.path]
    except ValueError as error:
        keys = re.search(r"keys: (\[.*?\])", str(error))
        raise UsageError(
            f"--model {source}: variable {variable.path} matches more than one LayoutMap key "
            f"({keys.group(1) if keys else error}); make each variable's path match one key"
        ) from None
    if found is None:
        return ()
    key = keras_compat.layout_map_key(layout_map, found) or variable.path
    axes = tuple(found.axes)
    wrong = [axis for axis in axes if axis is not None and axis not in MESH_AXES]
    if wrong:
        raise UsageError(
            f"--model {source}: LayoutMap key {key!r} names the axis {wrong[0]!r}; a mesh here has the axes "
            f"'{BATCH_AXIS}' and '{MODEL_AXIS}' (None: unsharded)"
        )
    if len(axes) != len(variable.shape):
        raise UsageError(
            f"--model {source}: LayoutMap key {key!r} gives {variable.path} {axes}, {len(axes)} entries for its "
            f"shape of rank {len(variable.shape)} {list(variable.shape)}; give one entry per dimension"
        )
    if any(axes.count(axis) > 1 for axis in MESH_AXES):
        raise UsageError(
            f"--model {source}: LayoutMap key {key!r} gives {variable.path} {axes}; name each axis on one "
            f"dimension at most"
        )
    layout = tuple(UNSHARDED if axis is None else axis for axis in axes)
    return layout if any(axis != UNSHARDED for axis in layout) else ()


def unrolled_copy(model, keras, source: str, probe):
    """(the model every trainer computes with, what the header says of it): `model`, or with recurrent layers that
    Keras runs as a loop, a copy of it rebuilt with unroll=True holding its values (shared/model/keras_recurrent.py);
    UsageError in one line where the sequence has no fixed length."""
    from dtensor_vs_mirrored.shared.model.keras_recurrent import looping_layers, unknown_length, unroll, unroll_note

    looping = looping_layers(model, keras)
    if not looping:
        return model, []
    copy = with_values(rebuilt(model, keras, source, None), model)
    unroll(copy, keras)
    try:
        copy(probe, training=False)
    except ValueError as error:
        raise unknown_length(looping, source, error) from None
    return copy, [unroll_note(looping)]


def copy_in(model, keras, source: str, dtype: str):
    """The model rebuilt from its config with every layer's policy `dtype` (float64: its inputs' too, so that a
    float64 run computes in float64 end to end, as Keras casts a layer's inputs to its dtype policy), holding
    `model`'s values (widened exactly for float64)."""
    from dtensor_vs_mirrored.shared.model.keras_recurrent import unroll

    copy = with_values(rebuilt(model, keras, source, dtype), model)
    unroll(copy, keras)  # as `model` is (unrolled_copy): a subclassed model's config does not carry it
    return copy


def with_values(copy, model):
    """`copy` holding `model`'s values (widened where it is float64), and what its layers make of them when built
    (finalize_state: an adapted Normalization's mean and variance are constants it computes from its variables)."""
    for mine, theirs in zip(model.variables, copy.variables, strict=True):
        theirs.assign(np.asarray(mine.numpy()).astype(theirs.dtype))
    for layer in keras_compat.flat_layers(copy):
        if hasattr(layer, "finalize_state"):
            layer.finalize_state()
    return copy


def rebuilt(model, keras, source: str, dtype: Optional[str]):
    """A new model of the same layers and variable paths, rebuilt from `model`'s config without its compile settings
    (under a strategy's scope: its variables): as it is (`dtype` None), or with every layer's dtype policy `dtype`
    (float32, float64: every float32 dtype float64, or a mixed policy: float32 variables); its values are its
    initializers', not `model`'s. UsageError in one line when it cannot be rebuilt so."""
    custom = {type(layer).__name__: type(layer) for layer in keras_compat.flat_layers(model, include_self=True)}
    config = dict(keras.saving.serialize_keras_object(model))
    config.pop("compile_config", None)  # compiled under the strategy's scope, if at all (shared/training/keras_fit.py)
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    if dtype is not None:
        config = retyped(config, dtype)
        keras.config.set_floatx("float64" if dtype == "float64" else "float32")
    # A subclassed model's layers made in its __init__ take the global policy, and so does a functional model's own
    # (compile wraps its optimizer in a LossScaleOptimizer when that is mixed_float16).
    keras.config.set_dtype_policy(dtype or own_policy(model))
    try:
        with keras.saving.custom_object_scope(custom):
            if calls_nested_layers(model, keras):  # a tied head: Keras's config round trip would untie it
                copy = tied_copy(model, keras, (lambda node: retyped(node, dtype)) if dtype else (lambda node: node))
            else:
                copy = keras.saving.deserialize_keras_object(config)
        if not copy.built:
            copy.build_from_config(model.get_build_config())
    except Exception as error:  # noqa: BLE001 - the user's layers: any error is one line
        raise UsageError(
            f"--model {source}: the Keras model could not be rebuilt in {dtype or own_policy(model)} from its config "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); give every custom "
            f"layer get_config (a functional or Sequential model of Keras layers has it)"
        ) from None
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)
    mine, theirs = model.variables, copy.variables
    same = len(mine) == len(theirs) and all(
        tuple(a.shape) == tuple(b.shape) and a.trainable == b.trainable for a, b in zip(mine, theirs)
    )
    weight_dtype = "float64" if dtype == "float64" else "float32"
    wide = all(not is_float(v) or v.dtype == weight_dtype for v in theirs)
    if not same or not wide:
        raise UsageError(
            f"--model {source}: the Keras model rebuilt from its config in {dtype or own_policy(model)} has other "
            f"variables than it ({'their shapes differ' if not same else f'some are not {weight_dtype}'}); give "
            f"every custom layer a "
            f"get_config that rebuilds it, and no fixed float32 dtype"
        )
    return copy


def widened(node):
    """A serialized Keras config with every float32 dtype (a layer's policy, an Input's dtype) float64."""
    return retyped(node, "float64")


def retyped(node, dtype: str):
    """A serialized Keras config with every layer's dtype policy (float32 or mixed) `dtype`; for float64 every
    float32 dtype (an Input's, a loss's) float64 too. A mixed policy's inputs stay float32: its layers cast them."""
    if isinstance(node, dict):
        if node.get("class_name") == "DTypePolicy" and node.get("config", {}).get("name") in POLICIES:
            return {**node, "config": {**node["config"], "name": dtype}}
        wide = dtype == "float64"
        return {
            key: "float64" if wide and key == "dtype" and value == "float32" else retyped(value, dtype)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [retyped(value, dtype) for value in node]
    return node


def flops_per_example(model, probe, parameters: int) -> int:
    """Forward + backward: 3 times the forward's float operations as TensorFlow's profiler counts them on one
    example (matmuls, convolutions; an einsum it does not count); 6 per parameter when it counts none."""
    spec = tf.nest.map_structure(lambda tensor: tf.TensorSpec((1, *tensor.shape[1:]), tensor.dtype), probe)
    try:
        graph = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec).graph
        options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
        options["output"] = "none"
        with profiler_deprecations_dropped():
            counted = tf.compat.v1.profiler.profile(graph, options=options).total_float_ops
    except Exception:  # noqa: BLE001 - a figure for the GFLOP/s line only
        counted = 0
    return int(3 * counted) if counted else 6 * parameters


def describe(model, layout_map, inputs=()) -> str:
    kinds: Dict[str, int] = {}
    for layer in model.layers if not is_subclassed(model) else keras_compat.flat_layers(model):
        if type(layer).__name__ != "InputLayer":
            kinds[type(layer).__name__] = kinds.get(type(layer).__name__, 0) + 1
    layers = ", ".join(f"{name}" + (f" x{count}" if count > 1 else "") for name, count in kinds.items())
    laid_out = f"; LayoutMap of {len(layout_map)} keys" if layout_map is not None else ""
    several = f"; inputs {describe_inputs(inputs)}" if inputs else ""
    return f"Keras {type(model).__name__} {model.name}: {layers}{laid_out}{several}"


def cautions(model, keras) -> Tuple[Caution, ...]:
    """What the model's own layers make a trainer compute differently (output_cautions: what every trainer leaves
    out alike)."""
    from dtensor_vs_mirrored.shared.model.keras_layers import Dropout

    layers = keras_compat.flat_layers(model)
    unsynchronized = unsynchronized_batch_norms(layers, keras)
    random = [layer for layer in layers if draws(layer) and not isinstance(layer, Dropout)]
    found = []
    if unsynchronized:
        found.append(
            Caution(
                f"{', '.join(unsynchronized)}: Keras BatchNormalization without synchronized=True normalises each "
                f"MirroredStrategy replica's piece of the batch on its own (one device and DTensor: the global "
                f"batch); use BatchNormalization(synchronized=True) for the same model everywhere",
                ("mirrored",),
            )
        )
    if random:
        kinds = sorted({type(layer).__name__ for layer in random})
        dropout_only = kinds == ["Dropout"]
        found.append(
            Caution(
                f"{', '.join(layer.name for layer in random)}: Keras {' and '.join(kinds)} draws from a seed state: "
                f"DTensor XORs the seed with each device, MirroredStrategy's replicas each draw their piece from "
                f"the same state, so neither draws one device's numbers; "
                + (
                    RANDOM_LAYER_HINT
                    if dropout_only
                    else "dtensor_vs_mirrored.shared.model.keras_layers.Dropout replaces a Dropout"
                )
                + ("" if dropout_only else "; a layer built with rates of 0 draws nothing"),
                ("dtensor", "mirrored"),
                random=True,
            )
        )
    found += convolution_cautions(layers, keras)
    return tuple(found) + output_cautions(model, keras, getattr(model, "loss", None))


def unsynchronized_batch_norms(layers, keras) -> List[str]:
    """The names of Keras BatchNormalization layers that normalise each replica's piece on its own."""
    return [
        layer.name
        for layer in layers
        if isinstance(layer, keras.layers.BatchNormalization) and not getattr(layer, "synchronized", False)
    ]


def draws(layer) -> bool:
    """Whether a layer draws random numbers: it has a seed generator, and its rates (a Dropout's rate, an LSTM
    cell's dropout and recurrent_dropout) are not all 0, at which Keras draws nothing."""
    rates = [getattr(layer, name) for name in RATES if isinstance(getattr(layer, name, None), (int, float))]
    return bool(keras_compat.seed_generators(layer)) and not (rates and not any(rates))


def keras_saver(model, keras_variables, keras):
    """(weights, path): the weights written into the user's model (float32) and it saved as a .keras file that
    plain Keras loads: a drop-in Dropout is saved as keras.layers.Dropout (the same at inference)."""
    from dtensor_vs_mirrored.shared.model.keras_layers import Dropout

    has_drop_in = any(isinstance(layer, Dropout) for layer in keras_compat.flat_layers(model))

    def save(weights: Sequence[np.ndarray], path: str) -> None:
        for variable, value in zip(keras_variables, weights, strict=True):
            variable.assign(np.asarray(value, np.float32))
        plain = plain_copy(model, keras) if has_drop_in else model
        if plain is not model:
            for mine, theirs in zip(model.variables, plain.variables, strict=True):
                theirs.assign(mine.value)
        plain.save(path)

    return save


def plain_copy(model, keras):
    """The model rebuilt from its config with each shared.model.keras_layers.Dropout a keras.layers.Dropout."""

    def plain(node):
        if isinstance(node, dict):
            if node.get("registered_name") == "shared>Dropout":
                return {**node, "module": "keras.layers", "class_name": "Dropout", "registered_name": None}
            return {key: plain(value) for key, value in node.items()}
        if isinstance(node, list):
            return [plain(value) for value in node]
        return node

    copy = keras.saving.deserialize_keras_object(plain(keras.saving.serialize_keras_object(model)))
    if not copy.built:
        copy.build_from_config(model.get_build_config())
    return copy
