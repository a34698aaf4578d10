"""mixed_float16's dynamic loss scaling, as Keras 3.15.1's LossScaleOptimizer does it
(keras/src/optimizers/loss_scale_optimizer.py), written once for every trainer.

The loss is multiplied by the scale before the backward pass (float16 gradients would underflow otherwise) and each
gradient of a float32 weight divided by it straight after: a power of two, so the division is exact and the sum
of the unscaled gradients is the unscaled sum. The decision is the optimizer's, on the gradient it is handed, the
combined one (the reference's own, DTensor's global one, MirroredStrategy's summed replicas'), so every trainer
decides alike: a non-finite entry halves the scale and skips the step (weights, slots and step count unchanged);
a finite step counts, and the 2000th finite step in a row doubles the scale (and starts the count again).

The scale is held as its power of two's offset from the initial 2**15 (an int64 zero at the start, made as the
step count is, so every trainer's reset, checkpoint and copy of the optimizer's state handles it as it does the
step): the rules are Keras's, the value exact.
"""

from typing import Optional

import tensorflow as tf

INITIAL_SCALE_EXPONENT = 15  # Keras's initial_scale=2.0**15
GROWTH_STEPS = 2000  # Keras's dynamic_growth_steps


def mixed_compute(config) -> Optional[str]:
    """The Model's compute dtype for `config`: bfloat16 or float16 under a mixed policy, None otherwise."""
    return config.compute_dtype if config.compute_dtype != config.weight_dtype else None


class DynamicLossScale(tf.Module):
    """The scale's exponent offset, the finite steps since it last changed, and the skipped steps: three int64
    scalars made by `make_count()` (the trainer's step-count factory)."""

    def __init__(self, make_count):
        super().__init__()
        self.exponent_offset = make_count()
        self.finite_steps = make_count()
        self.skipped = make_count()

    def scale(self) -> tf.Tensor:
        """2 ** (15 + offset) as a float32, built from its exponent bits (exact; float32 holds 2**-126..2**127)."""
        exponent = tf.cast(self.exponent_offset.read_value() + INITIAL_SCALE_EXPONENT + 127, tf.int32)
        return tf.bitcast(tf.bitwise.left_shift(exponent, 23), tf.float32)

    def update(self, finite: tf.Tensor) -> None:
        """After a step whose combined gradient was `finite` (a bool scalar) or not: Keras's rules."""
        offset, count = self.exponent_offset.read_value(), self.finite_steps.read_value()
        taken = tf.cast(finite, tf.int64)
        grows = taken * tf.cast(tf.equal(count, GROWTH_STEPS - 1), tf.int64)  # arithmetic: no DTensor control flow
        self.exponent_offset.assign(offset + grows - (1 - taken))  # +1 on growth, -1 on a skip
        self.finite_steps.assign((count + 1) * (taken - grows))  # 0 after a skip or a growth
        self.skipped.assign(self.skipped.read_value() + 1 - taken)


def all_finite(grads) -> tf.Tensor:
    """Whether every entry of every gradient is finite (on DTensor a sharded gradient's test spans its shards)."""
    return tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(grad)) for grad in grads]))


def scaled(loss, loss_scale):
    """The loss the backward pass starts from: `loss` times the scale (None: as it is)."""
    return loss if loss_scale is None else loss * tf.cast(loss_scale, loss.dtype)


def unscaled(grads, loss_scale):
    """Gradients of the scaled loss back to the loss's: divided by the power-of-two scale, exactly."""
    return grads if loss_scale is None else [grad / tf.cast(loss_scale, grad.dtype) for grad in grads]


def loss_scale_of(optimizer) -> Optional[tf.Tensor]:
    """The scale a step multiplies its loss by: the optimizer's, None without loss scaling."""
    state = getattr(optimizer, "loss_scale", None)
    return None if state is None else state.scale()


def kept(finite: Optional[tf.Tensor], new, old):
    """`new` where the step is taken, `old` where a non-finite gradient skips it (`finite` None: no scaling). The
    condition is broadcast first: DTensor (TF 2.21) crashes the process on a where of a scalar condition."""
    return new if finite is None else tf.where(tf.broadcast_to(finite, new.shape), new, old)


def loss_scale_record(optimizer) -> Optional[str]:
    """What loss scaling did, for the history's details: "loss scale 32768, 0 of 16 steps skipped"; None without."""
    state = getattr(optimizer, "loss_scale", None)
    if state is None:
        return None
    skipped, steps = int(state.skipped.numpy()), int(optimizer.step.numpy()) + int(state.skipped.numpy())
    scale = 2.0 ** (INITIAL_SCALE_EXPONENT + int(state.exponent_offset.numpy()))
    return f"loss scale {scale:g}, {skipped} of {steps} steps skipped (non-finite gradient)"


def skipped_steps(optimizer) -> Optional[int]:
    """The steps loss scaling skipped so far; None without loss scaling."""
    state = getattr(optimizer, "loss_scale", None)
    return None if state is None else int(state.skipped.numpy())
