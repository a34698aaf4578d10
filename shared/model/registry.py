"""`--model`: the tutorial's MLP, the ViT, the character GPT, or your own definition from a file, loaded and
checked once.

    python compare.py --model vit --data embedded
    python compare.py --model gpt --data embedded
    python compare.py --model examples/my_model.py:my_model --data embedded

A file's function takes no arguments and returns a `dtensor_vs_mirrored.shared.model.ModelDefinition`
(examples/my_model.py is one to copy), or a built Keras 3 model, alone or with its LayoutMap
(`(model, layout_map)`: shared/model/keras.py, examples/keras_cnn.py); a Keras model is built after
`keras.utils.set_random_seed(--seed)`. It is loaded and checked before anything trains:
a definition no trainer could build, a forward that fails on two examples of its input spec,
or a variable that gets no gradient is one line that names the variable or the line of your
file, exit 2.
"""

import contextlib
import functools
import importlib.util
import os
import re
import sys
from typing import List, Optional, Sequence

import tensorflow as tf

from dtensor_vs_mirrored.shared.config import BUILT_IN_MODELS, TUTORIAL_HIDDEN
from dtensor_vs_mirrored.shared.errors import UsageError, installed, one_line
from dtensor_vs_mirrored.shared.model.definition import Model, ModelDefinition, check_definition
from dtensor_vs_mirrored.shared.model.gpt import gpt
from dtensor_vs_mirrored.shared.model.keras import is_keras_model, keras_2_hint, keras_definition, prepare_keras
from dtensor_vs_mirrored.shared.model.mlp import mlp
from dtensor_vs_mirrored.shared.model.named_inputs import batch_spec, describe_inputs, example_batch
from dtensor_vs_mirrored.shared.model.vit import vit

REGISTERED: dict = {}  # spec -> a definition handed over in this process (dtensor_vs_mirrored.shared.api.check_model)


def register(definition, source: str, seed: int = 0) -> str:
    """A definition or Keras model (or a function returning one) given as an object, as a spec that `load` knows
    in this process: "object:<name>#<n>". Checked as a file's is; a function is called after `seed` is set."""
    if callable(definition) and not isinstance(definition, ModelDefinition) and not is_keras_model(definition):
        definition = call_seeded(definition, seed, f"model {source}: it")
    if is_keras_model(definition):
        definition = keras_definition(definition, source)
    spec = f"object:{getattr(definition, 'name', type(definition).__name__)}#{len(REGISTERED)}"
    REGISTERED[spec] = check_forward(check_definition(definition, source), source)
    return spec


def definition_for(config) -> ModelDefinition:
    """The run's model: config.model with config.hidden (the MLP's only), config.dropout (the built-in ones') and
    config.seed (a Keras model's initial values)."""
    definition = load(config.model, config.hidden, config.dropout, config.seed)
    if definition.prepare_dtype is not None:  # a Keras model's copy in a mixed dtype: made now, before any trace
        definition.prepare_dtype(config.dtype)
    return definition


@functools.lru_cache(maxsize=None)
def load(spec: str, hidden: Optional[Sequence[int]] = None, dropout: float = 0.0, seed: int = 0) -> ModelDefinition:
    """One definition per spec and process: every trainer of a run shares it. `dropout`: the built-in models';
    `seed`: what a file's Keras model is built from."""
    if spec == "mlp":
        return mlp(TUTORIAL_HIDDEN if hidden is None else tuple(hidden), dropout)
    if spec == "vit":
        return vit(dropout)
    if spec == "gpt":
        return gpt(dropout)
    if spec in REGISTERED:
        return REGISTERED[spec]
    path, colon, function_name = spec.rpartition(":")
    if not colon or not path.endswith(".py") or not function_name.isidentifier():
        raise UsageError(f"--model {spec!r} is unknown; use {', '.join(BUILT_IN_MODELS)} or FILE.py:FUNCTION")
    built = call_user_function(path, function_name, spec, seed)
    if is_keras_model(built):
        built = keras_definition(built, spec)
    return check_forward(check_definition(built, spec), spec)


def model_mismatch(written: str, wanted: str) -> str:
    """Why a checkpoint of the model named `written` does not restore into `wanted`, and what would."""
    if written.startswith("mlp ") and wanted.startswith("mlp "):
        return (
            f"was written for hidden {hidden_text(written)} but --hidden {hidden_text(wanted)} was given; "
            f"use --hidden {hidden_text(written)}"
        )
    return (
        f"holds the model {written!r}, not this run's {wanted!r}; restore it with the --model (and --hidden) "
        f"that wrote it"
    )


def hidden_text(model_name: str) -> str:
    """ "mlp 784-700-500-10" -> "700,500", as --hidden takes it."""
    return ",".join(model_name.split(" ", 1)[1].split("-")[1:-1])


def call_user_function(path: str, function_name: str, spec: str, seed: int = 0):
    if not os.path.isfile(path):
        raise UsageError(f"--model {spec}: no file {path}")
    module_name = "user_model_" + os.path.splitext(os.path.basename(path))[0]
    with siblings_importable(path):
        try:
            module_spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        except Exception as error:  # noqa: BLE001 - the user's file: any error is one line
            raise UsageError(f"--model {spec}: importing {path} raised {describe(error)}{keras_2_hint()}") from None
        function = getattr(module, function_name, None)
        if not callable(function):
            raise UsageError(f"--model {spec}: {path} has no function {function_name}")
        return call_seeded(function, seed, f"--model {spec}: {function_name}()")


@contextlib.contextmanager
def siblings_importable(path: str):
    """FILE.py's own directory first on sys.path while it is imported and its function called, as `python FILE.py`
    would have it: `import helpers` finds FILE.py's sibling helpers.py. Taken off again after, so that it
    shadows nothing in the rest of the process."""
    directory = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, directory)
    try:
        yield
    finally:
        sys.path.remove(directory)  # the first occurrence: the one inserted here


def call_seeded(function, seed: int, what: str):
    """function(), after Keras's seed is set where Keras is imported; again if it imported Keras itself and
    returned a Keras model (built before the seed was set)."""
    for _ in range(2):
        seeded = prepare_keras(seed)
        try:
            result = function()
        except Exception as error:  # noqa: BLE001 - the user's function: any error is one line
            raise UsageError(f"{what} raised {describe(error)}{keras_2_hint()}") from None
        if seeded or not is_keras_model(result):
            return result
    return result


def check_forward(definition: ModelDefinition, spec: str) -> ModelDefinition:
    """Run the forward and its gradient once on two examples on the host: a forward that raises, returns other
    than [2, *label_shape, classes] logits, or leaves a variable without a gradient is one line now rather
    than a failed trainer later."""
    fed = f"inputs {list((2, *definition.input_shape))} {definition.input_dtype}"
    if definition.inputs:
        fed = f"inputs {describe_inputs(definition.inputs)} of 2 examples"
    with tf.device("/CPU:0"):
        model = Model(definition, definition.initial_values(seed=0))
        context = first_step_context(model)
        try:
            with tf.GradientTape() as tape:
                logits = model(example_batch(definition, 2), context)
                loss = tf.reduce_sum(logits)
            model.apply_updates(context)
        except Exception as error:  # noqa: BLE001 - the user's forward: any error is one line
            raise UsageError(f"--model {spec}: its forward raised {describe(error)} on {fed}") from None
        want = (2, *definition.output_shape)
        if tuple(logits.shape) != want:
            classes = f", {definition.classes} classes" if definition.targets == "classes" else ""
            raise UsageError(
                f"--model {spec}: its forward returned shape {list(logits.shape)} for {fed}; it must return "
                f"{'logits' if classes else f'{definition.targets} outputs'} {list(want)} (label_shape "
                f"{list(definition.label_shape)}{classes})"
            )
        gradients = tape.gradient(loss, model.trainable)
    missing = [
        variable.name for variable, gradient in zip(definition.trainable_variables, gradients) if gradient is None
    ]
    if missing:
        raise UsageError(
            f"--model {spec}: variable {missing[0]} gets no gradient from the forward (unused, or updated by assign); "
            f"remove it, use it in the forward, or declare it Variable(..., trainable=False) and update it with "
            f"context.update"
        )
    return definition


def first_step_context(model: Model):
    """A training context of step 0 for the two examples the checks here feed a forward."""
    return model.training_context(tf.constant(0, tf.int64), tf.range(2, dtype=tf.int64))


def random_ops(definition: ModelDefinition) -> List[str]:
    """The random ops (tf.random.*, tf.nn.dropout) that the forward runs in training, by type, in graph order:
    each trainer draws them differently (shared/model/forward.py). ForwardContext.dropout runs none. None named
    for a model whose cautions name its random layers already (a Keras Dropout), with what to use instead."""
    if any(caution.random for caution in definition.cautions):
        return []

    @tf.function
    def training_forward(model, inputs):
        return model(inputs, first_step_context(model))

    with tf.device("/CPU:0"):
        model = Model(definition, definition.initial_values(seed=0))
        spec = batch_spec(definition, 2)
        try:
            graph = training_forward.get_concrete_function(model, spec).graph
        except Exception:  # noqa: BLE001 - a forward that does not trace here has no random ops to name
            return []
    found = []
    for operation in graph.get_operations():
        if RANDOM_OP.search(operation.type) and not NOT_A_DRAW.search(operation.type) and operation.type not in found:
            found.append(operation.type)
    return found


RANDOM_OP = re.compile(r"Random|Multinomial|TruncatedNormal")
NOT_A_DRAW = re.compile(r"GetKeyCounter|GetAlg")  # a stateless op's key preparation: the draw is named beside it


def describe(error: BaseException) -> str:
    """`Type: first line (file:line)`, where the innermost frame in a user's file is (not TensorFlow's)."""
    return one_line(error, lambda filename: not is_library(filename))


def is_library(filename: str) -> bool:
    """A frame of TensorFlow, NumPy or this package's own layers rather than the user's file."""
    return installed(filename) or filename.startswith(os.path.dirname(__file__))
