"""`--model`: the tutorial's MLP, the ViT, or your own definition from a file.

    python compare.py --model vit --data embedded
    python compare.py --model examples/my_model.py:my_model --data embedded

A file's function takes no arguments and returns a `shared.model.ModelDefinition`
(examples/my_model.py is one to copy). It is loaded and checked before anything trains:
a definition no trainer could build, or a forward that fails on two images, is one line
that names the variable or the error, exit 2.
"""

import functools
import importlib.util
import os
import traceback
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from shared.config import Config
from shared.data import IMAGE_PIXELS, NUM_CLASSES
from shared.errors import UsageError
from shared.mlp import TUTORIAL_HIDDEN, mlp
from shared.model import Model, ModelDefinition, check_definition
from shared.optim import make_optimizer
from shared.vit import vit

BUILT_IN = ("mlp", "vit")


def definition_for(config) -> ModelDefinition:
    """The run's model: config.model with config.hidden (the MLP's only)."""
    return load(config.model, config.hidden)


def build_model_and_optimizer(config: Config):
    """The run's model from the shared initial values and its optimizer, all as plain tf.Variables:
    under `strategy.scope()` MirroredVariables, under `tf.device` placed there."""
    definition = definition_for(config)
    model = Model(definition, definition.initial_values(config.seed, config.dtype))
    optimizer = make_optimizer(
        config.optimizer,
        config.adam,
        model.weights,
        config.learning_rate,
        zeros_like=lambda var: tf.Variable(tf.zeros_like(var)),
        make_step=lambda: tf.Variable(0, dtype=tf.int64),
    )
    return model, optimizer


@functools.lru_cache(maxsize=None)
def load(spec: str, hidden: Optional[Sequence[int]] = None) -> ModelDefinition:
    """One definition per spec and process: every trainer of a run shares it."""
    if spec == "mlp":
        return mlp(TUTORIAL_HIDDEN if hidden is None else tuple(hidden))
    if spec == "vit":
        return vit()
    path, colon, function_name = spec.rpartition(":")
    if not colon or not path.endswith(".py") or not function_name.isidentifier():
        raise UsageError(f"--model {spec!r} is unknown; use {', '.join(BUILT_IN)} or FILE.py:FUNCTION")
    return check_forward(check_definition(call_user_function(path, function_name, spec), spec), spec)


def call_user_function(path: str, function_name: str, spec: str):
    if not os.path.isfile(path):
        raise UsageError(f"--model {spec}: no file {path}")
    module_name = "user_model_" + os.path.splitext(os.path.basename(path))[0]
    try:
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001 - the user's file: any error is one line
        raise UsageError(f"--model {spec}: importing {path} raised {describe(error)}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise UsageError(f"--model {spec}: {path} has no function {function_name}")
    try:
        return function()
    except Exception as error:  # noqa: BLE001 - the user's function: any error is one line
        raise UsageError(f"--model {spec}: {function_name}() raised {describe(error)}") from None


def check_forward(definition: ModelDefinition, spec: str) -> ModelDefinition:
    """Run the forward once on two images on the host: a forward that raises, or returns other than
    [2, 10] logits, is one line now rather than a failed trainer later."""
    with tf.device("/CPU:0"):
        model = Model(definition, definition.initial_values(seed=0))
        try:
            logits = model(np.zeros((2, IMAGE_PIXELS), np.float32))
        except Exception as error:  # noqa: BLE001 - the user's forward: any error is one line
            raise UsageError(f"--model {spec}: its forward raised {describe(error)} on 2 images") from None
    if tuple(logits.shape) != (2, NUM_CLASSES):
        raise UsageError(
            f"--model {spec}: its forward returned shape {list(logits.shape)} for 2 images; "
            f"it must return logits [N, {NUM_CLASSES}]"
        )
    return definition


def describe(error: BaseException) -> str:
    """`Type: first line (file:line)`, where the innermost frame in a user's file is."""
    frames = traceback.extract_tb(error.__traceback__)
    where = frames[-1] if frames else None
    message = str(error).splitlines()[0] if str(error) else ""
    return (
        f"{type(error).__name__}: {message}"
        + (f" ({os.path.basename(where.filename)}:{where.lineno})" if where else "")
    ).strip()
