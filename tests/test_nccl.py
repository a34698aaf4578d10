"""DTensor's NCCL switch (dtensor_impl/nccl.py): what it decides for each machine, and that the setting reaches
DTensor and TensorFlow's runtime before they start, as tests/test_dtensor.py checks for the all-reduce
combining. This machine has no GPU: the GPU facts are given, and what is checked is what DTensor and the
runtime read (DTensor's own config reader, the runtime's collective configuration), not a NCCL run."""

import json
import os
import subprocess
import sys

import pytest

from dtensor_vs_mirrored.dtensor_impl.nccl import VARIABLE, decide
from dtensor_vs_mirrored.shared.measure.traffic import Implementation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "facts, environ, expected, variables",
    [
        (("CPU", 8, True, 0, False), {}, Implementation("ring", False, "CPUs have no NCCL"), {}),
        (("GPU", 4, True, 4, False), {}, Implementation("NCCL", True, "one physical GPU per device"), {VARIABLE: "1"}),
        (
            ("GPU", 4, False, 4, False),
            {VARIABLE: "1"},
            Implementation("ring", False, "--no-dtensor-nccl"),
            {VARIABLE: "0"},
        ),
        # Logical GPUs split from one physical GPU: NCCL cannot run there, whatever the variable says.
        (
            ("GPU", 8, True, 1, False),
            {VARIABLE: "1"},
            Implementation("ring", False, "8 logical GPUs on 1 physical: NCCL needs one each"),
            {VARIABLE: "0"},
        ),
        (("GPU", 4, True, 4, False), {VARIABLE: "0"}, Implementation("ring", False, f"{VARIABLE}=0 set by you"), {}),
        (
            ("GPU", 4, True, 4, True),
            {VARIABLE: "1"},
            Implementation("ring", False, "TensorFlow had started before: as it was set"),
            {},
        ),
    ],
)
def test_nccl_wherever_tensorflow_allows_it_unless_turned_off(facts, environ, expected, variables):
    assert decide(*facts, environ) == (expected, variables)


# A fresh process; argv[1] "before": settle before anything starts TensorFlow's runtime, "after": after it.
SETTLE = """
import json, os, sys
from dtensor_vs_mirrored.dtensor_impl import combining, nccl
from dtensor_vs_mirrored.shared.devices import configure_devices
devices = configure_devices(8, "CPU")
import tensorflow as tf
from tensorflow.dtensor.python import config as dtensor_config
from tensorflow.experimental import dtensor
from tensorflow.python.eager import context
if sys.argv[1] == "after":
    tf.constant(1.0) + 1.0  # your own TensorFlow code first: the runtime starts
started_before = combining._dtensor_started()
setting = nccl.settle("GPU", 8, True, physical_gpus=8)  # the GPU machine's facts
mesh = dtensor.create_mesh([("batch", 8)], devices=devices)  # DTensor starts here, and all-reduces on its CPUs
summed = dtensor.relayout(dtensor.call_with_layout(tf.ones, dtensor.Layout.batch_sharded(mesh, "batch", 1), shape=[8]),
                          dtensor.Layout.replicated(mesh, 1))
print(json.dumps({"setting": [setting.name, setting.nccl, setting.reason], "dtensor_started_before": started_before,
                  "variable": os.environ.get(nccl.VARIABLE),
                  "dtensor_reads": dtensor_config.gpu_use_nccl_communication(),
                  "runtime_collective_nccl": context.context().config.experimental.collective_nccl,
                  "dtensor_started_after": combining._dtensor_started(), "sum": float(tf.reduce_sum(summed))}))
"""


def settle_in_a_process(when: str) -> dict:
    env = {key: value for key, value in os.environ.items() if key != VARIABLE}
    done = subprocess.run(
        [sys.executable, "-c", SETTLE, when], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_setting_reaches_dtensor_and_the_runtime_before_they_start():
    facts = settle_in_a_process("before")
    assert facts["setting"] == ["NCCL", True, "one physical GPU per device"]
    assert facts["dtensor_started_before"] is False and facts["dtensor_started_after"] is True
    assert facts["variable"] == "1" and facts["dtensor_reads"] is True  # DTensor's own reader of the variable
    assert facts["runtime_collective_nccl"] is True  # what the runtime's collectives were configured with
    assert facts["sum"] == 8.0  # and DTensor's CPU collectives run as before


def test_after_tensorflow_started_the_setting_says_so_and_changes_nothing():
    facts = settle_in_a_process("after")
    assert facts["setting"] == ["ring", False, "TensorFlow had started before: as it was set"]
    assert facts["variable"] is None and facts["dtensor_reads"] is False
    assert facts["runtime_collective_nccl"] is False and facts["sum"] == 8.0


def test_a_cpu_trainer_says_it_has_no_nccl(devices, embedded):
    from dtensor_vs_mirrored.dtensor_impl.trainer import DTensorTrainer
    from dtensor_vs_mirrored.shared.config import Config

    trainer = DTensorTrainer(Config(trainers=("dtensor",), epochs=1, quiet=True), embedded, devices)
    assert trainer.collectives == Implementation("ring", False, "CPUs have no NCCL")
    assert trainer.details["collectives"] == "ring (CPUs have no NCCL)"
    assert os.environ.get(VARIABLE) != "1"


@pytest.mark.parametrize(
    "cross_device_ops, devices, update, expected",
    [
        (
            "NcclAllReduce",
            ["GPU:0", "GPU:1"],
            "replicas",
            Implementation("NcclAllReduce", True, "one physical GPU per replica"),
        ),
        # NcclAllReduce sums onto one destination with ReductionToOneDevice
        # (tensorflow/python/distribute/cross_device_ops.py).
        (
            "NcclAllReduce",
            ["GPU:0", "GPU:1"],
            "primary",
            Implementation(
                "ReductionToOneDevice", False, "the primary update sums on one device: NcclAllReduce falls back to it"
            ),
        ),
        (
            "ReductionToOneDevice",
            ["GPU:0", "GPU:1"],
            "replicas",
            Implementation("ReductionToOneDevice", False, "NCCL needs one physical GPU each"),
        ),
        (
            "ReductionToOneDevice",
            ["CPU:0", "CPU:1"],
            "primary",
            Implementation("ReductionToOneDevice", False, "CPUs have no NCCL"),
        ),
    ],
)
def test_mirrored_rows_name_what_summed_the_gradients(cross_device_ops, devices, update, expected):
    import tensorflow as tf

    from dtensor_vs_mirrored.mirrored_impl.collectives import implementation

    assert implementation(getattr(tf.distribute, cross_device_ops)(), devices, update) == expected
