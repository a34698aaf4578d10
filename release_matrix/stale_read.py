"""Does DTensor read a stale value right after assigning a variable in a tf.function? One JSON line.

    python -m release_matrix.stale_read                 # all-reduce combining on (TensorFlow's default)
    python -m release_matrix.stale_read --combine off   # as the DTensor trainer runs on CPU

Builds the trainer's model on a `batch=8` mesh of logical CPUs, computes one batch's
gradients and, in the same `tf.function`, assigns 0.1 x each gradient to a slot
DVariable and reads the slot back: the read of the tutorial's Adam. Prints, e.g. on
TensorFlow 2.21 with combining on,

    {"tensorflow": "2.21.0", "combine_all_reduces": true, "variables": 6, "stale_variables": 5, ...}

where a stale variable is one whose read differs from the value just assigned to it
(README, "How this differs from the tutorial"). Exit code 0 either way: the answer is
the output. Costs one TensorFlow start and one trace, ~5 s on 2 cores.
"""

import argparse
import json
import os
import sys

import tensorflow as tf
from tensorflow.experimental import dtensor

from dtensor_vs_mirrored.dtensor_impl.combining import VARIABLE as COMBINE_ALL_REDUCES
from dtensor_vs_mirrored.dtensor_impl.inputs import pack_batch
from dtensor_vs_mirrored.dtensor_impl.mesh import MeshSpec, create_mesh
from dtensor_vs_mirrored.dtensor_impl.variables import build_model
from dtensor_vs_mirrored.shared.devices import configure_devices
from dtensor_vs_mirrored.shared.model.mlp import mlp
from dtensor_vs_mirrored.shared.training.data import load_data
from dtensor_vs_mirrored.shared.training.losses import mean_loss

DEVICES = 8
BATCH = 128


def check(combine: bool) -> dict:
    """Assign then read every slot once on a `batch=DEVICES` mesh; the facts as a dict."""
    # DTensor reads the variable once, when it starts (only "0" turns combining off): set it first.
    os.environ[COMBINE_ALL_REDUCES] = "1" if combine else "0"
    mesh = create_mesh(MeshSpec(batch=DEVICES), configure_devices(DEVICES, "CPU"))
    definition = mlp()
    model = build_model(definition, definition.initial_values(seed=22), mesh)
    slots = [
        dtensor.DVariable(dtensor.call_with_layout(tf.zeros, w.layout, shape=w.shape, dtype=w.dtype))
        for w in model.weights
    ]
    data = load_data("embedded", train_examples=BATCH, test_examples=1)

    @tf.function
    def assign_then_read(x, y, example_weights):
        with tf.GradientTape() as tape:
            loss = mean_loss(model(x), y, tf.reduce_sum(example_weights), example_weights)
        grads = tape.gradient(loss, model.weights)
        assigned, read = [], []
        for grad, slot in zip(grads, slots):
            value = 0.1 * grad
            slot.assign(value)
            assigned.append(tf.reduce_max(tf.abs(value)))
            read.append(tf.reduce_max(tf.abs(slot)))  # DTensor may return the slot's old value here
        return assigned, read

    assigned, read = assign_then_read(*pack_batch(data.x_train, data.y_train, mesh))
    assigned, read = [float(a) for a in assigned], [float(r) for r in read]
    stale = [a != r for a, r in zip(assigned, read)]
    return {
        "tensorflow": tf.__version__,
        "combine_all_reduces": combine,
        "devices": DEVICES,
        "variables": len(stale),
        "stale_variables": sum(stale),
        "stale_read": any(stale),
        "max_abs_assigned": assigned,  # per variable, in model.weights order (w0, b0, w1, ...)
        "max_abs_read": read,
        "read_zero_variables": sum(r == 0.0 for r in read),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--combine",
        choices=("on", "off"),
        default="on",
        help="DTensor's all-reduce combining (DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION)",
    )
    args = parser.parse_args(argv)
    print(json.dumps(check(args.combine == "on")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
