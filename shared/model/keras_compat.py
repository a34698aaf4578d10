"""Keras's private attributes the tool reads, in one place: each where Keras 3 gives no public way, with the
release it was checked on (Keras 3.15.1, TensorFlow 2.21), so that another release breaks here, loudly.
"""

from typing import Callable, Optional, Tuple


def flat_layers(model, include_self: bool = False) -> list:
    """Every layer inside `model`, nested models' layers too (Keras 3.15.1: Layer._flatten_layers; model.layers
    lists only the top level)."""
    return list(model._flatten_layers(include_self=include_self, recursive=True))


def call_takes_training(model) -> bool:
    """Whether `model.call` takes `training` (Keras 3.15.1: Layer._call_has_training_arg), so that stateless_call
    may be given it."""
    return getattr(model, "_call_has_training_arg", True)


def given_training(operation) -> bool:
    """Whether a graph's node passes `training` to its operation, as Functional's operation_fn does (Keras 3.15.1:
    Layer._call_context_args; a keras.ops node has none)."""
    return "training" in getattr(operation, "_call_context_args", ())


def has_graph(model) -> bool:
    """Whether `model` is a graph of layers (a functional model, or a Sequential built from an Input); False for a
    subclassed model (Keras 3.15.1: Functional._inputs_struct; Sequential._functional)."""
    return graph_of(model) is not None


def graph_of(model):
    """The Functional whose call nodes `model` runs: itself, a Sequential's inner Functional, or None (a subclassed
    model, a Sequential never built from a shape)."""
    if type(model).__name__ == "Sequential":
        return getattr(model, "_functional", None)
    return model if hasattr(model, "_inputs_struct") and hasattr(model, "_nodes_by_depth") else None


def run_graph(model, inputs, call_for: Callable[[object], Callable]):
    """`model`'s call as Functional.call makes it, each node's operation called through `call_for(operation)`
    (Keras 3.15.1: Functional._standardize_inputs, Function._run_through_graph and its operation_fn)."""
    graph = graph_of(model)
    flat = graph._standardize_inputs(inputs)
    outputs = graph._run_through_graph(flat, operation_fn=call_for)
    return outputs[0] if isinstance(outputs, (list, tuple)) and len(outputs) == 1 else outputs


def seed_generators(layer) -> list:
    """The SeedGenerators a layer draws from (Keras 3.15.1: Layer._seed_generators, which Keras's own random
    layers fill when they make one)."""
    return list(getattr(layer, "_seed_generators", None) or [])


def major_version(keras) -> int:
    """The installed Keras's major release, 0 where its version string does not start with a number."""
    return release(str(getattr(keras, "__version__", "0")))[0]


def release(version: str) -> Tuple[int, int]:
    """(major, minor) of a Keras version string ("3.15.1" -> (3, 15)); 0 for a part that is not a number."""
    parts = (version.split(".") + ["0", "0"])[:2]
    major, minor = (int(part) if part.isdigit() else 0 for part in parts)
    return major, minor


def layout_map_key(layout_map, layout) -> Optional[str]:
    """The key of `layout_map` whose value is `layout` (Keras 3.15.1: LayoutMap._layout_map, the dict behind it;
    LayoutMap[path] gives the layout a path matches, not the key that matched)."""
    return next((key for key in layout_map.keys() if layout_map._layout_map[key] is layout), None)


def loss_arguments(loss) -> dict:
    """The keyword arguments a LossFunctionWrapper gives its function, from_logits among them (Keras 3.15.1:
    LossFunctionWrapper._fn_kwargs)."""
    return dict(getattr(loss, "_fn_kwargs", None) or {})


def learning_rate_of(optimizer):
    """An optimizer's learning rate as compiled: a schedule itself, or the variable (Keras 3.15.1:
    BaseOptimizer._learning_rate; `learning_rate` reads a schedule's value at the current step)."""
    return optimizer._learning_rate


def adam_slots(optimizer) -> Optional[Tuple[list, list]]:
    """An Adam's first and second moments in the variables' order, None for another optimizer (Keras 3.15.1:
    Adam._momentums and Adam._velocities)."""
    if not (hasattr(optimizer, "_momentums") and hasattr(optimizer, "_velocities")):
        return None
    return list(optimizer._momentums), list(optimizer._velocities)


def inputs_by_name(model) -> dict:
    """A functional model's inputs by name: a dict of Inputs by its keys, a list by each Input's layer name (what
    keras.Input(name=...) sets), in the model's order (Keras 3.15.1: Functional._inputs_struct, KerasTensor.
    _keras_history; a list's KerasTensors are named keras_tensor, keras_tensor_1 unless given a name, and its call
    matches a dict by those)."""
    struct = graph_of(model)._inputs_struct
    if isinstance(struct, dict):
        return dict(struct)
    return {tensor._keras_history[0].name: tensor for tensor in model.inputs}


def takes_dict(model) -> bool:
    """Whether a functional model's inputs are a dict of Inputs, else a list (Keras 3.15.1: _inputs_struct)."""
    return isinstance(graph_of(model)._inputs_struct, dict)


def calls_taking(tensor) -> list:
    """(operation, its outputs, the Inputs of its own graph that `tensor` feeds: [] for a layer) of each call in a
    graph that takes the KerasTensor `tensor`: every call of the operation that made it, so a layer called twice is
    followed from both (Keras 3.15.1: KerasTensor._keras_history, Operation._outbound_nodes, Node.outputs,
    Node.arguments.keras_tensors: the call's tensors flat, a dict's by key as its graph's Inputs flatten)."""
    import keras

    history = getattr(tensor, "_keras_history", None)
    if history is None:
        return []
    found = []
    for node in history[0]._outbound_nodes:
        graph, fed = graph_of(node.operation), []
        if graph is not None:
            given, inner = node.arguments.keras_tensors, keras.tree.flatten(graph._inputs_struct)
            fed = (
                [mine for theirs, mine in zip(given, inner) if theirs is tensor] if len(given) == len(inner) else inner
            )
        found.append((node.operation, list(node.outputs), fed))
    return found
