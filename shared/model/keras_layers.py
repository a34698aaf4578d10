"""Keras layers that every trainer computes alike: a drop-in `Dropout` that draws through the forward's context.

    from dtensor_vs_mirrored.shared.model.keras_layers import Dropout
    x = Dropout(0.3, name="drop")(x)          # instead of keras.layers.Dropout(0.3)

Keras's own Dropout draws a stateless mask from a seed state: DTensor draws a sharded random op with the seed XORed
with the device and MirroredStrategy's replicas each draw their piece from the same state, so the masks differ
from one device's. This one, trained by compare.py, draws `ForwardContext.dropout`'s hash of (seed, step, call,
example position, element index): the same units on every mesh and replica. Anywhere else (your own `fit`,
`predict`, a loaded .keras file) it is Keras's Dropout.
"""

import threading
from contextlib import contextmanager

import keras

_active = threading.local()  # MirroredStrategy traces each replica's forward in a thread of its own


@contextmanager
def drawing_with(context):
    """Within: the Dropout layers of a Keras forward draw through `context` (a shared.model.ForwardContext)."""
    previous = getattr(_active, "context", None)
    _active.context = context
    try:
        yield
    finally:
        _active.context = previous


def active_context():
    """The ForwardContext of the Keras forward being traced in this thread, or None outside compare.py."""
    return getattr(_active, "context", None)


@keras.saving.register_keras_serializable(package="shared")
class Dropout(keras.layers.Dropout):
    """keras.layers.Dropout (rate, seed) whose mask is the same on one device, every DTensor mesh and every
    MirroredStrategy replica when compare.py trains it; Keras's own mask elsewhere. No noise_shape: it draws per
    element."""

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        if noise_shape is not None:
            raise ValueError(
                "dtensor_vs_mirrored.shared.model.keras_layers.Dropout draws every element on its own: give no "
                "noise_shape (keras.layers.SpatialDropout2D and the like draw differently on every trainer)"
            )
        super().__init__(rate, seed=seed, **kwargs)

    def call(self, inputs, training=False):
        context = active_context()
        if context is None:
            return super().call(inputs, training=training)
        return context.dropout(inputs, self.rate) if training else inputs
