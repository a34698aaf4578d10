"""Keras layers whose gradient DTensor cannot compute, named before anything trains: a depthwise convolution
(DepthwiseConv2D, SeparableConv2D and their 1-D forms; keras.applications' MobileNets and EfficientNets) and a
grouped one (Conv2D(groups=g) with g > 1). On TensorFlow 2.21 DTensor's step fails on the first ("'tf.
DepthwiseConv2dNativeBackpropFilter' op does not implement layout propagation") and on the second ("filter_size
does not have enough elements"): the caution says so in the header, and in DTensor's FAILED reason.
"""

from typing import List, Tuple

import tensorflow as tf

from dtensor_vs_mirrored.shared.model.definition import Caution, listed

DEPTHWISE = ("DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D", "SeparableConv2D")


def unlaid_convolutions(layers, keras) -> List[str]:
    """The names of the depthwise and grouped convolutions among `layers`."""
    return [
        layer.name
        for layer in layers
        if type(layer).__name__ in DEPTHWISE
        or (isinstance(layer, keras.layers.Conv2D) and getattr(layer, "groups", 1) > 1)
    ]


def convolution_cautions(layers, keras) -> Tuple[Caution, ...]:
    """DTensor's caution for the model's depthwise and grouped convolutions; () for none."""
    names = unlaid_convolutions(layers, keras)
    if not names:
        return ()
    return (
        Caution(
            f"{listed(names)}: depthwise or grouped convolutions: DTensor on TensorFlow {tf.__version__} cannot "
            f"compute their gradient (its depthwise filter gradient has no layout propagation, a grouped one fails), "
            f"so DTensor fails on this model while the reference and MirroredStrategy train it: leave dtensor out of "
            f"--trainers, or use plain Conv2D layers",
            ("dtensor",),
        ),
    )
