"""What is trained: a model definition (named variables, initial values, one forward, a layout each), the
built-in MLP, ViT and GPT, a Keras model (keras.py), and `--model FILE.py:FUNCTION` (registry.py). Imports nothing
from training.

    from dtensor_vs_mirrored.shared.model import ModelDefinition, Variable, ForwardContext, MODEL_AXIS, UNSHARDED
    from dtensor_vs_mirrored.shared.model import zeros, truncated_normal
"""

from dtensor_vs_mirrored.shared.model.definition import (
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
from dtensor_vs_mirrored.shared.model.forward import ForwardContext

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
