"""A copy of a functional model whose outer graph calls a layer of a model nested in it (a tied language-model head:
`backbone.token_embedding(hidden, reverse=True)` after `backbone(...)`), with that layer still one layer.

Keras's config round trip makes the outer call a second layer of its own (Functional.from_config creates each
top-level layer by name), so the copy would hold one variable more than the model: an untied head. Here the copy is
`keras.models.clone_model` with each layer cloned from its config once, and a nested layer the outer graph calls
the nested copy's own. Checked on Keras 3.15.1 with keras-hub 0.32.0's GemmaBackbone.
"""

from dtensor_vs_mirrored.shared.model import keras_compat


def calls_nested_layers(model, keras) -> bool:
    """Whether `model` is a plain functional model whose outer graph calls a layer of one of its nested models."""
    if type(model).__name__ != "Functional":  # a functional subclass rebuilds itself (its own from_config)
        return False
    nested = {
        id(inner)
        for layer in model.layers
        if isinstance(layer, keras.Model)
        for inner in keras_compat.flat_layers(layer)
    }
    return any(id(layer) in nested for layer in model.layers)


def tied_copy(model, keras, widen):
    """A new functional model of `model`'s graph: each layer cloned once from `widen(layer.get_config())`, its
    inputs `keras.Input`s of `widen`'s dtypes, a nested layer called again outside its model the nested copy's
    own. Its values are its initializers'; it is not compiled, as rebuilt's copies are not."""
    clones = {}

    def clone(layer):
        if id(layer) not in clones:
            copy = type(layer).from_config(widen(layer.get_config()))
            originals = keras_compat.flat_layers(layer, include_self=True)
            copies = keras_compat.flat_layers(copy, include_self=True)
            same = len(originals) == len(copies) and all(type(a) is type(b) for a, b in zip(originals, copies))
            for original, made in zip(originals, copies) if same else [(layer, copy)]:
                clones[id(original)] = made  # a nested layer's copy, for the outer graph's call of it
        return clones[id(layer)]

    def new_input(tensor):
        dtype = widen({"dtype": str(tensor.dtype)})["dtype"]
        return keras.Input(batch_shape=tensor.shape, dtype=dtype, name=tensor.name)

    for layer in model.layers:  # nested models first: the outer graph may call their layers before them
        if isinstance(layer, keras.Model):
            clone(layer)
    inputs = keras.tree.map_structure(new_input, model.input)
    compiled = model.compiled  # clone_model compiles a compiled model's clone: the copies take no compile settings
    model.compiled = False
    try:
        return keras.models.clone_model(model, input_tensors=inputs, clone_function=clone)
    finally:
        model.compiled = compiled
