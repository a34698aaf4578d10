"""Per-step checksums of the training state: what names the first variable that differs.

In float64 runs each trainer computes, in the graph, sum |x| of every weight, bias and Adam slot at
the start of every step (where the step itself reads the state, so a stale read shows) and once
after the last: one number per variable instead of the whole state. A sum of non-negative terms
does not cancel, so any change moves it. Cost: one reduction per variable per step; float32 runs
record none (docs/parity.md).
"""

from typing import List

import numpy as np
import tensorflow as tf


def state_variables(model, optimizer) -> list:
    """The training state in a fixed order: the variables [w0, b0, w1, ...] (running statistics too), then Adam's
    m and v slots (of the trainable ones)."""
    return list(model.weights) + list(getattr(optimizer, "m", [])) + list(getattr(optimizer, "v", []))


def state_names(definition, optimizer) -> List[str]:
    """What each row of `state_checksums` is, for messages: "layer 0 weight", "layer 1 bias Adam v"."""
    names, trainable = definition.labels, definition.trainable_labels
    slots = [f"{name} Adam {slot}" for slot in ("m", "v") for name in trainable] if hasattr(optimizer, "m") else []
    return names + slots


def state_sizes(definition, optimizer) -> List[int]:
    """The number of elements of each row of `state_checksums` (unpadded)."""
    sizes = [int(np.prod(definition.shape(variable))) for variable in definition.variables]
    trainable = [size for size, variable in zip(sizes, definition.variables) if variable.trainable]
    return sizes + (trainable * 2 if hasattr(optimizer, "m") else [])


def state_checksums(variables) -> tf.Tensor:
    """[len(variables)] float64: sum |x| of each variable's current value."""
    return tf.stack([tf.reduce_sum(tf.abs(tf.cast(variable, tf.float64))) for variable in variables])


def read_state_checksums(variables) -> tf.Tensor:
    """`state_checksums` run eagerly, after the last training call has returned: the final state.

    Not a tf.function: its trace would be keyed on the variables' shapes alone and reused for
    another strategy's MirroredVariables, reading the wrong copies. Eagerly, under MirroredStrategy
    (cross-replica context) a MirroredVariable reads replica 0's copy. Once per run: cheap.
    """
    return state_checksums(variables)
