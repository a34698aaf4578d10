"""What a Keras model trains against on the project's trainers: its compiled loss per example, its own losses (weight
regularizers, activity regularizers, add_loss) and what its compiled optimizer becomes. docs/keras.md, "The objective".

The compiled loss is called unreduced (a `keras.losses.Loss`'s `call`, a function as it is): `Loss.__call__` reduces
itself and, in a replica context, divides by the replica count (keras/src/losses/loss.py scale_loss_for_distribution),
and converts to its own dtype (floatx, float32 in a float64 run). Every trainer then reduces the per-example values
as the project does (shared/training/losses.py): the sum over the counted examples / their global count. An
uncompiled model keeps the softmax cross-entropy of its logits.
"""

from typing import Optional, Tuple

from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.model import keras_compat
from dtensor_vs_mirrored.shared.model.definition import Caution, OptimizerChoice

BINARY_LOSSES = ("binary_crossentropy", "binary_focal_crossentropy")  # 0/1 labels of the output's shape
CLASS_LOSSES = ("sparse_categorical_crossentropy",)  # class ids, the output's last axis the classes


def compiled_loss(model, keras, source: str):
    """(the compiled loss resolved to a function or a keras.losses.Loss, how the header names it); (None, "") for
    a model not compiled or compiled without a loss. UsageError for several losses (one per output)."""
    loss = getattr(model, "loss", None) if getattr(model, "compiled", False) else None
    if loss is None:
        return None, ""
    if isinstance(loss, (list, tuple, dict)):
        raise UsageError(
            f"--model {source}: the model is compiled with {len(loss)} losses; it has one output: compile it with "
            f"one loss"
        )
    resolved = keras.losses.get(loss) if isinstance(loss, str) else loss
    if not callable(resolved):
        raise UsageError(f"--model {source}: the compiled loss {loss!r} is not a Keras loss or a function")
    return resolved, describe_loss(loss, resolved, keras)


def describe_loss(given, resolved, keras) -> str:
    """ "mse", "BinaryCrossentropy(from_logits=True)", "my_loss": as the user wrote it, its from_logits said."""
    if isinstance(given, str):
        return given
    if isinstance(resolved, keras.losses.Loss):
        logits = getattr(resolved, "_fn_kwargs", {}).get("from_logits")
        return f"{type(resolved).__name__}" + (f"(from_logits={logits})" if logits is not None else "")
    return getattr(resolved, "__name__", type(resolved).__name__)


def function_name(resolved, keras) -> str:
    """The Keras function behind a loss ("binary_crossentropy" for BinaryCrossentropy()); a custom one's name."""
    if hasattr(resolved, "fn") and isinstance(resolved, keras.losses.Loss):
        return getattr(resolved.fn, "__name__", "")
    return getattr(resolved, "__name__", type(resolved).__name__)


def from_logits(resolved, keras) -> bool:
    if hasattr(resolved, "fn") and isinstance(resolved, keras.losses.Loss):
        return bool(keras_compat.loss_arguments(resolved).get("from_logits", False))
    return False  # a loss function by name takes Keras's default, probabilities


def per_example(resolved, keras, name: str):
    """The definition's loss hook: (outputs, labels) -> Keras's unreduced values, one per example (and position)."""
    if isinstance(resolved, keras.losses.Loss):

        def loss(outputs, labels):
            return resolved.call(labels, outputs)  # call: unreduced, unscaled, in the outputs' dtype
    else:

        def loss(outputs, labels):
            return resolved(labels, outputs)

    loss.__name__ = name
    return loss


def objective_fields(model, keras, outputs, source: str) -> dict:
    """The definition's fields of what trains: targets, label shape, classes, the loss hook, the binary threshold
    and the objective's line, from the compiled loss (an uncompiled model: class ids, softmax cross-entropy)."""
    resolved, name = compiled_loss(model, keras, source)
    output_shape = tuple(outputs.shape[1:])
    kind = function_name(resolved, keras) if resolved is not None else "sparse_categorical_crossentropy"
    targets = "classes" if kind in CLASS_LOSSES else "binary" if kind in BINARY_LOSSES else "values"
    fields = {
        "targets": targets,
        "label_shape": output_shape[:-1] if targets == "classes" else output_shape,
        "classes": int(output_shape[-1]),
        "loss": per_example(resolved, keras, name) if resolved is not None else None,
        "binary_threshold": 0.0 if from_logits(resolved, keras) else 0.5,
        "objective": describe_objective(model, name, targets),
        "optimizer": optimizer_choice(model),
    }
    if targets == "classes" and fields["classes"] < 2:
        raise UsageError(
            f"--model {source}: the loss {name or 'softmax cross-entropy'} takes class ids, and the output's last "
            f"axis is {fields['classes']} class; give it a unit per class, or compile a loss of one unit "
            f"(keras.losses.BinaryCrossentropy(from_logits=True) for 0/1 labels, 'mse' for values)"
        )
    return fields


def describe_objective(model, loss_name: str, targets: str) -> str:
    """The header's line on what trains: the loss and how it is reduced, the model's own losses, the optimizer."""
    what = {"classes": "class ids", "binary": "0/1 labels", "values": "float targets"}[targets]
    if loss_name:
        line = f"the compiled loss {loss_name} on {what}, per example, averaged over the global batch"
    else:
        line = "the softmax cross-entropy of the logits on class ids (the model is not compiled with a loss)"
    weights, forward = own_loss_counts(model)
    if weights or forward:
        parts = [f"{weights} weight regularizer{'s' * (weights != 1)}"] * bool(weights)
        parts += [f"{forward} loss{'es' * (forward != 1)} of the forward (activity regularizers, add_loss)"] * bool(
            forward
        )
        line += f"; plus the model's own losses, once a step: {', '.join(parts)}"
    optimizer = describe_optimizer(model)
    if optimizer and optimizer_choice(model) is not None:
        kind = type(compiled_optimizer(model)).__name__
        line += f"; the compiled optimizer {optimizer} trains, as the project's {kind}"
    elif optimizer:
        line += (
            f"; the compiled optimizer {optimizer} is set aside: the optimizer above trains (--optimizer, "
            f"--learning-rate; --fit trains with yours)"
        )
    return line


# A compiled optimizer's settings that the project's Adam and SGD do not have: any of them set, it is set aside.
NOT_CARRIED = ("weight_decay", "clipnorm", "global_clipnorm", "clipvalue", "loss_scale_factor")
NOT_CARRIED_FLAGS = ("use_ema", "amsgrad", "nesterov", "momentum", "gradient_accumulation_steps")


def optimizer_choice(model) -> Optional[OptimizerChoice]:
    """A compiled Keras Adam or plain SGD as the project's optimizer trains it: its learning rate (a schedule
    called on the updates applied so far, as Keras calls it on `iterations`), betas and epsilon; None for any
    other optimizer or setting (the objective line says it is set aside)."""
    optimizer = compiled_optimizer(model)
    kind = type(optimizer).__name__
    if optimizer is None or kind not in ("Adam", "SGD") or type(optimizer).__module__.split(".")[0] != "keras":
        return None
    config = optimizer.get_config()
    if not_carried(config):
        return None
    rate = keras_compat.learning_rate_of(optimizer)
    learning_rate = rate if hasattr(rate, "get_config") else float(optimizer.learning_rate)
    moments = {key: float(config[key]) for key in ("beta_1", "beta_2", "epsilon") if key in config}
    return OptimizerChoice(kind.lower(), learning_rate, describe_optimizer(model), **moments)


def compiled_optimizer(model):
    """The model's compiled optimizer, None when it is not compiled; inside a LossScaleOptimizer (compile wraps one
    round it under mixed_float16) its inner one: the project's own loss scaling stands in for the wrapper
    (shared/training/loss_scale.py, Keras's rules) wherever the run is mixed_float16."""
    optimizer = getattr(model, "optimizer", None) if getattr(model, "compiled", False) else None
    return getattr(optimizer, "inner_optimizer", optimizer)


def describe_optimizer(model) -> str:
    """The compiled optimizer as the header names it: "Adam(learning_rate=CosineDecay)", "SGD(learning_rate=0.01)";
    "" for a model not compiled."""
    optimizer = compiled_optimizer(model)
    if optimizer is None:
        return ""
    rate = keras_compat.learning_rate_of(optimizer)
    rate_text = type(rate).__name__ if hasattr(rate, "get_config") else f"{float(optimizer.learning_rate):g}"
    config = optimizer.get_config()
    moments = "".join(f", {key}={config[key]:g}" for key in ("beta_1", "beta_2", "epsilon") if key in config)
    return f"{type(optimizer).__name__}(learning_rate={rate_text}{moments}{not_carried(config)})"


def not_carried(config: dict) -> str:
    """The settings of a compiled optimizer's config that the project's Adam and SGD do not have, as a call's
    arguments (", momentum=0.9"): the reason it is set aside; "" for none."""
    found = [key for key in NOT_CARRIED if config.get(key) is not None]
    found += [key for key in NOT_CARRIED_FLAGS if config.get(key)]
    return "".join(
        f", {key}={config[key]:g}" if isinstance(config[key], float) else f", {key}={config[key]}" for key in found
    )


def own_loss_counts(model) -> Tuple[int, int]:
    """(weight regularizers, the forward's own losses: activity regularizers and add_loss), from the probe call's
    `model.losses` (regularizers of the weights are computed from them alone)."""
    weights = sum(1 for variable in model.trainable_variables if getattr(variable, "regularizer", None) is not None)
    return weights, max(0, len(model.losses) - weights)


def output_cautions(model, keras, loss) -> Tuple[Caution, ...]:
    """What differs in the objective: a softmax output under the default loss of logits (every trainer alike), and
    losses computed from the examples a forward sees (a piece's on MirroredStrategy, padded ones on DTensor)."""
    found = []
    if own_loss_counts(model)[1]:
        found.append(
            Caution(
                "the model adds losses computed from its examples (an activity regularizer, add_loss): "
                "MirroredStrategy weighs each replica's by its share of the global batch (right for a mean over "
                "the examples, as Keras's activity regularizer is), and DTensor's batch holds zero padding examples "
                "where the global batch does not divide over the batch axis",
                ("dtensor", "mirrored"),
            )
        )
    last = model.layers[-1] if model.layers else None
    activation = getattr(getattr(last, "activation", None), "__name__", "")
    if loss is None and (isinstance(last, keras.layers.Softmax) or activation == "softmax"):
        found.append(
            Caution(
                f"{last.name}: the model's output is a softmax, but the loss is the softmax cross-entropy of logits: "
                f"remove the output's softmax, or compile the model with its loss "
                f"(keras.losses.SparseCategoricalCrossentropy())"
            )
        )
    return tuple(found)
