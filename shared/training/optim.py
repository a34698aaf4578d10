"""Adam and SGD: the update maths, written once, and the optimizers every trainer uses.

A trainer only says how to make a zero variable like a given one (a tf.Variable,
a MirroredVariable under a strategy scope, a DVariable with the same layout); the
maths and the order of reads and writes are shared.

`--adam tutorial` keeps the tutorial's formulation on purpose, so that the parity
check can be seen to catch it: it assigns each slot and then reads it back (on
DTensor, inside a tf.function, that read returned stale zeros while DTensor's
all-reduce combining was on: docs/tutorial-differences.md), and it
keeps the step count in a Python float, which tf.function freezes at trace time so
bias correction never advances. `--adam fixed` (the default) reads every slot before
writing it and keeps the step count in a variable. `--clip-global-norm` clips what a trainer hands it (`clipped`).
"""

from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.training.loss_scale import DynamicLossScale, all_finite, kept

ADAM_BETA_1 = 0.9
ADAM_BETA_2 = 0.999
ADAM_EPSILON = 1e-7


def dense(grads):
    """Gradients as dense tensors: an embedding's gather gives `IndexedSlices`, which every trainer sums,
    checks and applies as the dense gradient it stands for (as Keras's Adam, whose sparse update is the same)."""
    return [tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad for grad in grads]


def adam_update(grad, m, v, step, learning_rate, beta_1=ADAM_BETA_1, beta_2=ADAM_BETA_2, epsilon=ADAM_EPSILON):
    """One bias-corrected Adam step from values read before any write: (param decrease, new_m, new_v).

    `step` is the 1-based number of this update. The decrease is the textbook
    learning_rate * m_hat / (sqrt(v_hat) + epsilon), with m_hat = new_m / (1 - beta_1**step)
    and v_hat = new_v / (1 - beta_2**step), rearranged so that the bias corrections are
    scalars: learning_rate * sqrt(1 - beta_2**step) / (1 - beta_1**step) * new_m /
    (sqrt(new_v) + epsilon * sqrt(1 - beta_2**step)), the same value up to float rounding.
    Each elementwise op streams a weight-sized buffer; written this way a step takes 11 of
    them per variable instead of 14, and `assign_sub` subtracts in place. DTensor, which runs
    them unfused, took 11% less time per step at 2 devices and 12% less at 8.
    """
    new_m = m + (1.0 - beta_1) * (grad - m)  # = beta_1 * m + (1 - beta_1) * grad
    new_v = v + (1.0 - beta_2) * (tf.square(grad) - v)  # = beta_2 * v + (1 - beta_2) * grad**2
    root_correction = tf.sqrt(1.0 - beta_2**step)
    step_size = learning_rate * root_correction / (1.0 - beta_1**step)
    return step_size * new_m / (tf.sqrt(new_v) + epsilon * root_correction), new_m, new_v


def clip_by_global_norm(grads, clip_norm: float):
    """(grads scaled by clip_norm / max(global norm, clip_norm), whether the norm was above clip_norm): Keras's
    and tf.clip_by_global_norm's arithmetic. On DTensor each sum of squares of a sharded gradient is an
    all-reduce over its shards, so the norm is the global gradient's on every mesh."""
    norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(grad)) for grad in grads]))
    limit = tf.cast(clip_norm, norm.dtype)
    scale = limit / tf.maximum(norm, limit)
    return [grad * tf.cast(scale, grad.dtype) for grad in grads], norm > limit


def clipped(optimizer, grads):
    """--clip-global-norm: the gradient `optimizer` is handed, clipped to its `clip_norm` (None: as it is), and
    its `clipped` count of the steps whose global norm was above it (a variable made as its step count is, on the
    trainer's devices; absent without clipping, so checkpoints without it are unchanged). Clipping in the optimizer
    acts on what each trainer hands it, the combined gradient: the reference's own, DTensor's global one (its norm
    summed over the shards), MirroredStrategy's summed replicas'; never a replica's part of it, as Keras's
    clipnorm under a strategy does (docs/keras.md)."""
    if optimizer.clip_norm is None:
        return grads
    grads, above = clip_by_global_norm(grads, optimizer.clip_norm)
    optimizer.clipped.assign(optimizer.clipped.read_value() + tf.cast(above, tf.int64))
    return grads


def rate_at(learning_rate, updates_before, dtype):
    """The update's learning rate: a float as it is, or a schedule's value at the updates applied before it (a
    Keras LearningRateSchedule's `step`), in the weights' dtype."""
    if callable(learning_rate):
        return tf.cast(learning_rate(updates_before), dtype)
    return learning_rate


def screened(optimizer, grads):
    """mixed_float16: (the combined gradient with zeros for a skipped step's, whether the step is taken), the loss
    scale updated by Keras's rules (shared/training/loss_scale.py); (grads, None) without loss scaling."""
    if optimizer.loss_scale is None:
        return grads, None
    finite = all_finite(grads)
    optimizer.loss_scale.update(finite)
    return [kept(finite, grad, tf.zeros_like(grad)) for grad in grads], finite


def counted_step(step, finite):
    """The step count after this update: one more, unless loss scaling skipped it."""
    return step if finite is None else step - 1 + tf.cast(finite, step.dtype)


class SGD(tf.Module):
    """Plain SGD; `step` counts its updates (what dropout's numbers are drawn from, as Adam's)."""

    def __init__(
        self, learning_rate: float, make_step: Callable, clip_norm: Optional[float] = None, loss_scaled: bool = False
    ):
        super().__init__()
        self.learning_rate = learning_rate
        self.step = make_step()
        self.clip_norm = clip_norm
        if clip_norm is not None:
            self.clipped = make_step()
        self.loss_scale = DynamicLossScale(make_step) if loss_scaled else None

    def apply_gradients(self, grads, variables):
        before = self.step.read_value()
        grads, finite = screened(self, dense(grads))  # a skipped step's zeros leave every weight as it is
        for grad, var in zip(clipped(self, grads), variables):
            var.assign_sub(rate_at(self.learning_rate, before, var.dtype) * grad)
        self.step.assign(counted_step(before + 1, finite))


class Adam(tf.Module):
    """Adam with slots `m` (first moment) and `v` (second moment) made by `zeros_like`.

    zeros_like(var) -> a zero variable of var's shape (and placement or layout).
    make_step() -> an int64 scalar zero variable for the step count.
    """

    def __init__(
        self,
        variables: Sequence[tf.Variable],
        learning_rate: float,
        zeros_like: Callable,
        make_step: Callable,
        formulation: str = "fixed",
        clip_norm: Optional[float] = None,
        moments: Sequence[float] = (ADAM_BETA_1, ADAM_BETA_2, ADAM_EPSILON),
        loss_scaled: bool = False,
    ):
        super().__init__()
        self.learning_rate = learning_rate
        self.moments = tuple(moments)  # beta_1, beta_2, epsilon
        self.formulation = formulation
        self.m: List[tf.Variable] = [zeros_like(var) for var in variables]
        self.v: List[tf.Variable] = [zeros_like(var) for var in variables]
        self.step = make_step()
        self.clip_norm = clip_norm
        if clip_norm is not None:
            self.clipped = make_step()
        self.tutorial_t = 1.0  # the tutorial's Python-float step count (only for "tutorial")
        self.loss_scale = DynamicLossScale(make_step) if loss_scaled else None

    def apply_gradients(self, grads, variables):
        grads, finite = screened(self, dense(grads))  # mixed_float16: `finite` False skips the step
        grads = clipped(self, grads)
        if self.formulation == "tutorial":
            return self._apply_as_tutorial(grads, variables, finite)
        # Read the step once, write it last: DTensor would re-read a stale value after a write.
        step = self.step.read_value() + 1
        for grad, var, m, v in zip(grads, variables, self.m, self.v):
            rate = rate_at(self.learning_rate, step - 1, var.dtype)
            old_m, old_v = m.read_value(), v.read_value()
            decrease, new_m, new_v = adam_update(grad, old_m, old_v, tf.cast(step, var.dtype), rate, *self.moments)
            m.assign(kept(finite, new_m, old_m))
            v.assign(kept(finite, new_v, old_v))
            var.assign_sub(kept(finite, decrease, tf.zeros_like(decrease)))
        self.step.assign(counted_step(step, finite))

    def _apply_as_tutorial(self, grads, variables, finite=None):
        """The tutorial's Adam.apply_gradients, kept verbatim in substance (see the module docstring); `finite`
        False (mixed_float16's skipped step) keeps the slots as they were."""
        beta_1, beta_2, ep = ADAM_BETA_1, ADAM_BETA_2, ADAM_EPSILON
        for i, (d_var, var) in enumerate(zip(grads, variables)):
            self.m[i].assign(kept(finite, beta_1 * self.m[i] + (1 - beta_1) * d_var, self.m[i]))
            self.v[i].assign(kept(finite, beta_2 * self.v[i] + (1 - beta_2) * tf.square(d_var), self.v[i]))
            m_dvar_bc = self.m[i] / (1 - (beta_1**self.tutorial_t))  # read after assign
            v_dvar_bc = self.v[i] / (1 - (beta_2**self.tutorial_t))
            decrease = self.learning_rate * (m_dvar_bc / (tf.sqrt(v_dvar_bc) + ep))
            var.assign_sub(kept(finite, decrease, tf.zeros_like(decrease)))
        self.tutorial_t += 1.0  # Python float: runs at trace time only


@tf.function(jit_compile=True)
def apply_gradients_fused(optimizer, grads, variables):
    """`optimizer.apply_gradients`, compiled by XLA into one pass per variable.

    Unfused, Adam runs a dozen or more elementwise ops per variable, each reading and writing
    a whole weight-sized buffer, and logical devices sharing a CPU's cores each hold a copy of
    weights and slots that together outgrow its cache (docs/throughput.md). The same maths,
    so the same values up to float rounding. The reference and MirroredStrategy trainers
    use it; DTensor does not compile with XLA on CPU (jit_compile is ignored there).
    """
    optimizer.apply_gradients(grads, variables)


def make_optimizer(config: Config, variables, zeros_like: Callable, make_step: Callable, choice=None):
    """The run's optimizer as `config` says (--optimizer, --adam, --learning-rate, --clip-global-norm), or the model's
    own `choice` (ModelDefinition.optimizer: a compiled Keras Adam or SGD, its hyperparameters and schedule); a
    mixed_float16 run's with dynamic loss scaling (shared/training/loss_scale.py). `zeros_like` and `make_step` make
    its slots and step where the trainer keeps its variables."""
    name, learning_rate = (
        (choice.name, choice.learning_rate) if choice is not None else (config.optimizer, config.learning_rate)
    )
    clip_norm, loss_scaled = config.clip_global_norm, config.dtype == "mixed_float16"
    if name == "sgd":
        return SGD(learning_rate, make_step, clip_norm, loss_scaled)
    moments = (choice.beta_1, choice.beta_2, choice.epsilon) if choice is not None else None
    extra = {"moments": moments} if moments else {}
    return Adam(
        variables, learning_rate, zeros_like, make_step, config.adam, clip_norm, loss_scaled=loss_scaled, **extra
    )


def clipping_record(optimizer) -> Optional[str]:
    """What --clip-global-norm did so far, for the history's details: "clipped 15 of 16 steps (global norm above
    1)"; None without it. A replicated variable reads one device's copy."""
    if getattr(optimizer, "clip_norm", None) is None:
        return None
    clipped_count, steps = int(optimizer.clipped.numpy()), int(optimizer.step.numpy())
    return f"clipped {clipped_count} of {steps} steps (global gradient norm above {optimizer.clip_norm:g})"
