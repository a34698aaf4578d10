"""`--model`: the tutorial's MLP, the ViT, or your own definition from a file, loaded and checked once.

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

from shared.errors import UsageError
from shared.model.definition import Model, ModelDefinition, check_definition
from shared.model.mlp import TUTORIAL_HIDDEN, mlp
from shared.model.mnist import IMAGE_PIXELS, NUM_CLASSES
from shared.model.vit import vit

BUILT_IN = ("mlp", "vit")


def definition_for(config) -> ModelDefinition:
    """The run's model: config.model with config.hidden (the MLP's only)."""
    return load(config.model, config.hidden)


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


def option_value(name: str, value):
    """A model option as a run takes it: --hidden's default (None) is the tutorial's 700,500, as reports
    from before --model recorded it."""
    return list(TUTORIAL_HIDDEN) if name == "hidden" and value is None else value


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
