"""DTensor's softmax cross-entropy over logits split on the class dimension, and two ways round it. One JSON line.

    python -m release_matrix.split_classes

On a `batch=4,model=2` mesh of logical CPUs, in float64, a column-parallel head (its kernel [width, classes] split
on `model`) gives logits split on the class dimension. The mean loss and the kernel's gradient are computed three
ways, each against one device's: `raw`, tf.nn.sparse_softmax_cross_entropy_with_logits over the split logits;
`gathered`, the logits relaid out to the classes whole first (dtensor_impl/classes.py: what the trainer does);
`vocab_parallel`, Megatron's cross-entropy on the split logits (the max and the sum of exponentials reduced over
the classes, which DTensor all-reduces over `model`; the label's logit picked by a mask: tf.one_hot there does not
expand). Two cases: MNIST's head (128 examples, 10 classes) and a vocabulary (64 x 64 tokens, 1024 classes), with
the median ms of a call of loss and gradients. Prints, e.g.
    {"tensorflow": "2.21.0", "mesh": "batch=4,model=2", "mnist head": {"raw": {"loss": 0.0, ...}, ...}, ...}

Exit code 0 either way: the answer is the output (docs/parity.md, "Known DTensor defects").
"""

import json
import statistics
import sys
import time

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from dtensor_vs_mirrored.dtensor_impl.classes import whole_classes
from dtensor_vs_mirrored.dtensor_impl.mesh import MeshSpec, create_mesh
from dtensor_vs_mirrored.dtensor_impl.variables import on_mesh, to_numpy
from dtensor_vs_mirrored.shared.devices import configure_devices
from dtensor_vs_mirrored.shared.model.definition import BATCH_AXIS, MODEL_AXIS, UNSHARDED

MESH = MeshSpec(batch=4, model=2)
CASES = {"mnist head": ((128,), 32, 10), "vocabulary": ((64, 64), 32, 1024)}  # (examples' shape, width, classes)
ROUNDS = 20  # timed calls a way, after one that traces


def raw(logits, labels, mesh):
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def gathered(logits, labels, mesh):
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=whole_classes(mesh)(logits))


def vocab_parallel(logits, labels, mesh):
    """Each label's cross-entropy from logits kept split on the class dimension: only [N, ...] values cross it."""
    split = [BATCH_AXIS] + [UNSHARDED] * (logits.shape.rank - 2) + [MODEL_AXIS]
    logits = dtensor.relayout(logits, dtensor.Layout(split, mesh))
    shifted = logits - tf.expand_dims(tf.stop_gradient(tf.reduce_max(logits, -1)), -1)  # an all-reduced max
    log_sum = tf.math.log(tf.reduce_sum(tf.exp(shifted), -1))  # an all-reduced sum
    classes = tf.range(logits.shape[-1], dtype=labels.dtype)
    picked = tf.where(tf.equal(tf.expand_dims(labels, -1), classes), shifted, tf.zeros_like(shifted))
    return log_sum - tf.reduce_sum(picked, -1)


WAYS = {"raw": raw, "gathered": gathered, "vocab_parallel": vocab_parallel}


def case_values(shape, width: int, classes: int, seed: int = 0):
    """(hidden [*shape, width], kernel [width, classes], labels [*shape]) as host arrays."""
    rng = np.random.default_rng(seed)
    kernel = rng.normal(size=(width, classes)) / width**0.5
    return rng.normal(size=(*shape, width)), kernel, rng.integers(0, classes, shape)


def one_device(hidden, kernel, labels):
    """(mean loss, the kernel's gradient) on one device: what every way is judged against."""
    kernel = tf.constant(kernel)
    with tf.GradientTape() as tape:
        tape.watch(kernel)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=tf.constant(hidden) @ kernel)
        )
    return float(loss), tape.gradient(loss, kernel).numpy()


def loss_and_gradient(way, mesh):
    @tf.function
    def call(hidden, kernel, labels):
        with tf.GradientTape() as tape:
            tape.watch(kernel)
            loss = tf.reduce_mean(way(hidden @ kernel, labels, mesh))
        return loss, tape.gradient(loss, kernel)

    return call


def measure(way, mesh, values) -> dict:
    """One way's loss and its differences from one device's, and ms a call (median of ROUNDS); its error instead
    where DTensor cannot expand it."""
    hidden, kernel, labels = values
    want_loss, want_gradient = one_device(hidden, kernel, labels)
    rest = [UNSHARDED] * (hidden.ndim - 1)
    on = (
        on_mesh(hidden, dtensor.Layout([BATCH_AXIS, *rest], mesh)),
        on_mesh(kernel, dtensor.Layout([UNSHARDED, MODEL_AXIS], mesh)),  # a column-parallel head
        on_mesh(labels, dtensor.Layout([BATCH_AXIS, *rest[1:]], mesh)),
    )
    call = loss_and_gradient(way, mesh)
    try:
        loss, gradient = call(*on)
    except (tf.errors.UnknownError, tf.errors.InvalidArgumentError) as error:
        return {"error": str(error).split("error: ", 1)[-1].splitlines()[0][:160]}
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        float(to_numpy(call(*on)[0]))  # host sync point
        times.append((time.perf_counter() - started) * 1e3)
    loss = float(to_numpy(loss))
    return {
        "loss": loss,
        "one_device_loss": want_loss,
        "rel_loss_diff": abs(loss - want_loss) / abs(want_loss),
        "max_abs_grad_diff": float(np.max(np.abs(to_numpy(gradient) - want_gradient))),
        "ms": round(statistics.median(times), 3),
    }


def check(mesh) -> dict:
    """Every way on every case, on `mesh` (a batch x model mesh)."""
    axes = f"{BATCH_AXIS}={mesh.dim_size(BATCH_AXIS)},{MODEL_AXIS}={mesh.dim_size(MODEL_AXIS)}"
    found = {"tensorflow": tf.__version__, "mesh": axes}
    for name, case in CASES.items():
        values = case_values(*case)
        found[name] = {way: measure(function, mesh, values) for way, function in WAYS.items()}
    return found


def main() -> int:
    print(json.dumps(check(create_mesh(MESH, configure_devices(MESH.device_count, "CPU")))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
