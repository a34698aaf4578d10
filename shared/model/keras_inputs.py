"""A Keras model of several inputs (a dict or a list of `keras.Input`s, a keras-hub backbone's
`{"token_ids", "padding_mask"}`) as named inputs (shared/model/named_inputs.py): each one's name, shape, dtype, and
for integers that reach an Embedding, its vocabulary (a 0/1 mask reaches none: it is checked only to be integers).
"""

import collections
from typing import Callable, Optional, Tuple

from dtensor_vs_mirrored.shared.model import keras_compat
from dtensor_vs_mirrored.shared.model.named_inputs import NamedInput, check_inputs


def keras_inputs(model, keras, source: str) -> Tuple[NamedInput, ...]:
    """A functional model's inputs, named as its call takes them, when it has several; () for one (or a subclassed
    model: its build shape is one input's). UsageError in one line for an input no trainer could feed."""
    if not keras_compat.has_graph(model) or len(getattr(model, "inputs", None) or []) < 2:
        return ()
    found = []
    for name, tensor in keras_compat.inputs_by_name(model).items():
        dtype = str(tensor.dtype)
        vocabulary = embedding_vocabulary(tensor, keras) if dtype.startswith("int") else None
        found.append(NamedInput(name, tuple(tensor.shape[1:]), dtype, vocabulary))
    check_inputs(found, source)
    return tuple(found)


def embedding_vocabulary(tensor, keras) -> Optional[int]:
    """The fewest token ids of the Embeddings nearest `tensor` in the model's graph (a nested model's too), each
    path followed up to its first Embedding; None when none is reached (a mask). Nearest: through the fewest layers
    and ops, a nested model's own Inputs no step, so that ids computed from the input (a BERT's segment ids as
    zeros_like(token_ids), into an Embedding of 2) do not bound the ids themselves."""
    vocabularies, seen, frontier = [], set(), collections.deque([(tensor, 0)])
    while frontier:  # breadth first: an operation is first reached by its shortest path
        tensor, depth = frontier.popleft()
        for operation, outputs, fed in keras_compat.calls_taking(tensor):
            if isinstance(operation, keras.layers.Embedding):
                vocabularies.append((depth, int(operation.input_dim)))
                continue
            frontier.extend((inner, depth) for inner in fed)  # a model used as a layer: on through its own graph
            if id(operation) not in seen:
                seen.add(id(operation))
                frontier.extend((output, depth + 1) for output in outputs)
    nearest = min((depth for depth, _ in vocabularies), default=None)
    return min(size for depth, size in vocabularies if depth == nearest) if vocabularies else None


def keras_arrangement(model) -> Callable:
    """A batch's dict of named inputs as the model's call (and model.fit) takes it: the dict itself for a dict of
    Inputs, a tuple in the model's order for a list of them (Keras matches a dict to a list by names the user never
    gave); one input as it is."""
    if not isinstance(getattr(model, "inputs", None), list) or len(model.inputs) < 2 or keras_compat.takes_dict(model):
        return lambda x: x
    names = list(keras_compat.inputs_by_name(model))
    return lambda x: tuple(x[name] for name in names)
