"""Which cross-device ops MirroredStrategy sums the gradients with, and how the tables name them."""

from typing import Sequence

import tensorflow as tf

from dtensor_vs_mirrored.shared.measure.traffic import Implementation


def choose_cross_device_ops(devices: Sequence[str]) -> tf.distribute.CrossDeviceOps:
    """NCCL across separate physical GPUs; otherwise reduce to one device and broadcast back.

    NCCL needs one physical GPU per replica: on logical GPUs split from one physical GPU it does not work
    (TensorFlow's own selection falls back to ReductionToOneDevice there), and CPUs have none. Chosen here, not
    left to TensorFlow: TF 2.21's default on CPUs, CollectiveAllReduce, keys its groups per process, so a
    2-replica then an 8-replica strategy in one process (a device sweep, the tests) abort with "joining a group
    with size8, but that group has size 2"; ReductionToOneDevice and NcclAllReduce keep no such state.
    """
    all_gpus = all(device.upper().startswith("GPU") for device in devices)
    one_physical_gpu_each = len(tf.config.list_logical_devices("GPU")) == len(tf.config.list_physical_devices("GPU"))
    if all_gpus and one_physical_gpu_each and len(devices) > 1:
        return tf.distribute.NcclAllReduce()
    return tf.distribute.ReductionToOneDevice()


def implementation(
    cross_device_ops: tf.distribute.CrossDeviceOps, devices: Sequence[str], update: str
) -> Implementation:
    """What the gradients' sum ran with, and why, for the result rows: choose_cross_device_ops's choice, except
    that NcclAllReduce sums onto one destination (`primary`) with ReductionToOneDevice (cross_device_ops.py)."""
    name = type(cross_device_ops).__name__
    if isinstance(cross_device_ops, tf.distribute.NcclAllReduce):
        if update == "primary":
            return Implementation(
                "ReductionToOneDevice", False, "the primary update sums on one device: NcclAllReduce falls back to it"
            )
        return Implementation(name, True, "one physical GPU per replica")
    if devices[0].upper().startswith("CPU"):
        return Implementation(name, False, "CPUs have no NCCL")
    return Implementation(name, False, "one replica" if len(devices) == 1 else "NCCL needs one physical GPU each")
