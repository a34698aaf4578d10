"""Keras's recurrent layers (LSTM, GRU, SimpleRNN, and a Bidirectional around one) as every trainer trains them:
from a copy of the model rebuilt with `unroll=True`.

Keras runs a recurrent layer's steps as a tf.while_loop over a TensorList, which DTensor cannot lay out (TF 2.21:
"'tf.EmptyTensorList' op does not implement layout propagation"). Unrolled over the fixed number of steps of its
input, the layer computes the same cell on the same values in the same order, so the reference, DTensor and
MirroredStrategy all train the unrolled copy: the same maths, said in the header. A sequence of unknown length
cannot be unrolled: one line before anything trains.
"""

from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.model import keras_compat


def looping_layers(model, keras) -> list:
    """The recurrent layers in `model` (nested models' too) that Keras would run as a loop."""
    return [
        layer for layer in keras_compat.flat_layers(model) if isinstance(layer, keras.layers.RNN) and not layer.unroll
    ]


def unroll(model, keras) -> list:
    """The recurrent layers of `model` (a copy the tool made) that ran as a loop, each now unrolled: a layer reads
    its `unroll` when called, and a subclassed model's config (which remakes its layers) does not carry it."""
    looping = looping_layers(model, keras)
    for layer in looping:
        layer.unroll = True
    return looping


def unroll_note(layers) -> str:
    """The header's words for the unrolled copy."""
    names = ", ".join(layer.name for layer in layers)
    return (
        f"{names}: trained unrolled (a copy rebuilt with unroll=True, on every trainer: the same maths as Keras's "
        f"loop, which DTensor cannot lay out)"
    )


def unknown_length(layers, source: str, error: Exception) -> UsageError:
    """The one line for a recurrent layer whose input has no fixed number of steps."""
    names = ", ".join(layer.name for layer in layers)
    return UsageError(
        f"--model {source}: {names}: a recurrent layer over a sequence of unknown length runs as a loop DTensor "
        f"cannot lay out (tf.EmptyTensorList), and cannot be unrolled ({str(error).splitlines()[0]}); give the "
        f"model's input a fixed length (keras.Input(shape=(steps, ...)))"
    )
