"""What is trained: a model definition (named variables, initial values, one forward, a layout each), the
built-in MLP, ViT and GPT, a Keras model (keras.py), and `--model FILE.py:FUNCTION` (registry.py). Imports nothing
from training.

    from shared.model import ModelDefinition, Variable, ForwardContext, MODEL_AXIS, UNSHARDED, zeros, truncated_normal
"""

from shared.model.definition import (
    BATCH_AXIS,
    MODEL_AXIS,
    UNSHARDED,
    Model,
    ModelDefinition,
    Variable,
    check_definition,
    ones,
    truncated_normal,
    zeros,
)
from shared.model.forward import ForwardContext

__all__ = [
    "BATCH_AXIS",
    "ForwardContext",
    "MODEL_AXIS",
    "UNSHARDED",
    "Model",
    "ModelDefinition",
    "Variable",
    "check_definition",
    "ones",
    "truncated_normal",
    "zeros",
]
