"""One dtype's Keras model as the forward computes it: its own `stateless_call`, or, in a recording forward (the
first-difference replay), the same call run node by node through its graph with each call of a layer tapped.

Taps come from the outer graph's call nodes: a layer called twice is two taps (`shared`, then `shared#2`), a model
used as a layer (a transfer-learning base) is its layers' taps under its name (`base/dense`) and then its own
(`base`). A model whose graph cannot be run so (a subclassed model, or one that computes other logits that way)
trains untapped, and `Compute.untapped` says why (the header prints it).
"""

import dataclasses
from typing import Callable, Dict

import numpy as np
import tensorflow as tf

from dtensor_vs_mirrored.shared.model import keras_compat

TAP_REPEAT = "#"  # a layer's second call is tapped as `name#2`: Keras's own names (dense_1) are other layers'


@dataclasses.dataclass
class Compute:
    """One dtype's Keras model, and why its calls are not tapped ("" when they are)."""

    model: object
    untapped: str


def compute_for(model, probe) -> Compute:
    """`model`, tapped where its graph runs call by call to exactly its own logits on `probe` (one batch)."""
    if not keras_compat.has_graph(model):
        return Compute(model, "a subclassed model is not tapped")
    weights = [variable.value for variable in model.trainable_variables]
    state = [variable.value for variable in model.non_trainable_variables]
    try:
        expected, _ = model.stateless_call(weights, state, probe, training=False)
        found, _, _ = tapped_call(model, weights, state, probe, False, lambda name, value: value)
    except Exception as error:  # noqa: BLE001 - any Keras error: the model trains, untapped
        return Compute(model, f"its graph does not run call by call ({type(error).__name__}): not tapped")
    if not np.array_equal(np.asarray(expected), np.asarray(found)):
        return Compute(model, "run call by call its graph computes other logits: not tapped")
    return Compute(model, "")


def call_stateless(compute: Compute, weights, non_trainable, inputs, context):
    """(logits, new non-trainable values in the model's order): the model's stateless_call, its Dropout layers
    drawing through `context`; when `context` records, each call of a layer tapped on the way."""
    from dtensor_vs_mirrored.shared.model.keras_layers import drawing_with

    training = {"training": context.training} if keras_compat.call_takes_training(compute.model) else {}
    with drawing_with(context):
        if context.record and not compute.untapped:
            outputs, new_state, losses = tapped_call(
                compute.model, weights, non_trainable, inputs, context.training, context.tap
            )
        else:
            outputs, new_state, losses = compute.model.stateless_call(
                weights, non_trainable, inputs, return_losses=True, **training
            )
    for loss in losses:  # the model's own (regularizers, add_loss): added to the objective on every trainer
        context.add_loss(loss)
    return outputs, new_state


def tapped_call(model, weights, non_trainable, inputs, training: bool, tap: Callable):
    """What `model.stateless_call(..., return_losses=True)` returns, computed node by node: each call's output
    handed to `tap(name, value)` in forward order."""
    import keras

    mapping = [*zip(model.trainable_variables, weights), *zip(model.non_trainable_variables, non_trainable)]
    with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
        outputs = run_calls(model, inputs, training, Tapper(tap), "")
        losses = model.losses  # as stateless_call(..., return_losses=True) takes them
    new_state = [scope.get_current_value(variable) for variable in model.non_trainable_variables]
    kept = [old if new is None else new for old, new in zip(non_trainable, new_state, strict=True)]
    return outputs, kept, losses


class Tapper:
    """Names each call once (`name`, `name#2`, ...) and taps what it returns that has examples on its first axis."""

    def __init__(self, tap: Callable):
        self.tap = tap
        self.calls: Dict[str, int] = {}

    def name(self, name: str) -> str:
        self.calls[name] = self.calls.get(name, 0) + 1
        return name if self.calls[name] == 1 else f"{name}{TAP_REPEAT}{self.calls[name]}"

    def record(self, name: str, value):
        if tf.is_tensor(value) and value.shape.rank is not None and value.shape.rank >= 1:
            self.tap(name, value)


def run_calls(model, inputs, training: bool, tapper: Tapper, prefix: str):
    """`model`'s graph on `inputs`, as its call runs it; a nested model's graph run the same way inside it."""

    def call_for(operation):
        def call(*args, **kwargs):
            name = tapper.name(prefix + operation.name)
            # A mask of None for each of a dict's inputs (a model of several inputs used as a layer) is none.
            if keras_compat.has_graph(operation) and len(args) == 1 and all(v is None for v in tf.nest.flatten(kwargs)):
                output = run_calls(operation, args[0], training, tapper, f"{name}/")
            else:
                if keras_compat.given_training(operation):
                    kwargs["training"] = training
                output = operation(*args, **kwargs)
            tapper.record(name, output)
            return output

        return call

    return keras_compat.run_graph(model, inputs, call_for)
