"""What a forward pass may ask of the trainer that runs it: whether it trains, dropout that every trainer draws
alike, running statistics it updates, and taps that name its layers.

    def forward(variables, inputs, context):
        x = context.tap("dense", tf.matmul(inputs, variables["dense/w"]))
        x = context.dropout(tf.nn.relu(x), 0.1)
        ...

A forward of two arguments gets none of it. Randomness: DTensor draws a sharded random op at the local shape
with the seed XORed with the device index (dtensor/mlir/expansions/random_op_spmd_expander.cc), MirroredStrategy's
replicas each their own, so a tf.random mask changes with the mesh. `dropout` draws none: each element's number
is an integer hash of (seed, optimizer step, call index, the example's position in the global batch, the
element's index in it), computed where the example lives: the same bits on every device, in any layout.
"""

import inspect
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

MASK = 0xFFFFFFFF  # the hash works on 32-bit values held in int64 (products stay below 2**63)
MULTIPLIER = 0x45D9F3B  # a 32-bit integer hash's multiplier (two rounds of xorshift-multiply)


def mix(x: tf.Tensor) -> tf.Tensor:
    """A 32-bit integer hash of each element of int64 `x` in [0, 2**32): every output bit depends on every input
    bit. Elementwise, so the same on any device and in any layout."""
    for _ in range(2):
        x = tf.bitwise.bitwise_and(tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16)) * MULTIPLIER, MASK)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))


def uniform_like(x: tf.Tensor, positions: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
    """Numbers in [0, 1) of x's shape and dtype, each a hash of (key, its example's position in the global batch,
    its index on each further axis): an element's number does not depend on the shape around it, so a width
    padded with zero units (700 -> 704 on a model axis) keeps every real unit's number."""
    bits = mix(tf.bitwise.bitwise_xor(tf.bitwise.bitwise_and(positions, MASK), key))
    bits = tf.reshape(bits, [-1] + [1] * (x.shape.rank - 1))
    for axis in range(1, x.shape.rank):
        index = tf.reshape(tf.range(x.shape[axis], dtype=tf.int64), [-1] + [1] * (x.shape.rank - 1 - axis))
        bits = mix(tf.bitwise.bitwise_xor(bits, index))
    return tf.cast(bits, x.dtype) / float(2**32)


class ForwardContext:
    """One forward pass's requests: `training`, `dropout`, `update` (running statistics) and `tap`; what it computes
    in: `compute_dtype`.

    A trainer makes one per forward: `training` with the run's seed, the optimizer's step (before the update)
    and each example's position in the global batch; evaluation and serving make a default one.
    """

    def __init__(
        self,
        training: bool = False,
        seed: int = 0,
        step: Optional[tf.Tensor] = None,
        positions: Optional[tf.Tensor] = None,
        record: bool = False,
    ):
        self.training = training
        self.seed, self.step, self.positions = seed, step, positions
        self.record = record  # keep the tapped values (the first-difference replay)
        self.updates: Dict[str, tf.Tensor] = {}  # variable name -> its new value, applied after the step
        self.taps: List[Tuple[str, tf.Tensor]] = []  # (name, value) in forward order, when recording
        self.losses: List[tf.Tensor] = []  # the model's own scalar losses (a Keras model's regularizers, add_loss)
        self.random_calls = 0
        # The dtype the forward computes in (float32 weights cast to bfloat16 or float16 under a mixed --dtype), set
        # by the model before it calls the forward: a forward making its own tensors makes them in it.
        self.compute_dtype: tf.DType = tf.float32
        self.loss_scale: Optional[tf.Tensor] = None  # mixed_float16: what the trainer multiplies the loss by

    def dropout(self, x: tf.Tensor, rate: float) -> tf.Tensor:
        """x with each element zeroed at `rate` and the rest scaled by 1 / (1 - rate), in training only; the same
        elements on one device, on every mesh and on every replica (the module docstring). x's first axis is
        the examples."""
        if not self.training or rate == 0:
            return x
        if self.step is None or self.positions is None:
            raise ValueError("dropout needs a training context made by a trainer (its step and example positions)")
        stream = self.random_calls  # each call of the forward its own numbers
        self.random_calls += 1
        step = tf.bitwise.bitwise_and(tf.cast(self.step, tf.int64), MASK)
        key = mix(
            tf.bitwise.bitwise_xor(
                mix(tf.bitwise.bitwise_xor(mix(tf.constant(self.seed & MASK, tf.int64)), step)), stream
            )
        )
        keep = uniform_like(x, tf.cast(self.positions, tf.int64), key) >= rate
        return tf.where(keep, x / (1.0 - rate), tf.zeros_like(x))

    def update(self, name: str, value: tf.Tensor) -> None:
        """In training: the non-trainable variable `name` becomes `value` after this step (a moving mean)."""
        if self.training:
            self.updates[name] = value

    def add_loss(self, value: tf.Tensor) -> None:
        """A scalar the training loss adds once per global step (a weight penalty): every trainer adds it alike
        (shared/training/losses.py, with_model_losses). Computed from the examples this forward sees, it is their
        part of it: a MirroredStrategy replica's is weighed by its share of the global batch."""
        self.losses.append(value)

    def tap(self, name: str, x: tf.Tensor) -> tf.Tensor:
        """x, named: when a verdict is MISMATCH the replay compares every tapped value and its gradient with the
        reference's, in forward order, then backward. Free when not recording. x's first axis is the examples."""
        if self.record:
            self.taps.append((name, x))
        return x


def takes_context(forward) -> bool:
    """Whether a forward takes a third argument, the ForwardContext."""
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in parameters)
