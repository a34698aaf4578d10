"""Logical devices: N virtual CPUs (the tutorial's 8) or GPUs, configured once per process.

TensorFlow fixes its device list when it first initialises its runtime, so
`configure_devices` must run before anything touches a device. Configure the
largest count you need once; meshes and strategies then use the first N of them.
"""

import importlib.metadata
from typing import Dict, List, Optional

import tensorflow as tf

from dtensor_vs_mirrored.shared.errors import UsageError

MAX_LOGICAL_CPUS = 64
LOGICAL_GPU_MEMORY_MB = 2048  # per logical GPU when one physical GPU is split; the MLP needs far less

_configured = {}  # device type -> logical device count set up by this process


def configure_devices(count: int, device_type: str = "CPU", at_least: int = 0) -> List[str]:
    """Make (at least) `count` logical devices of `device_type`; return the first `count` names. A logical device
    setup made before (yours, before any op ran) is kept where it has `count` or more. `at_least`: logical CPUs to
    make where this call sets them up, if more than `count`, so that a later call in the process may ask for up to
    that many (the Python API's checks, in any order). Errors name compare.py's flags; check_model's name its
    arguments (shared.api.in_api_terms)."""
    device_type = device_type.upper()
    limit = MAX_LOGICAL_CPUS if device_type == "CPU" else None
    if count < 1 or (limit and count > limit):
        raise UsageError(f"--devices {count} is not possible; use 1 to {limit or 'the GPU count'}")
    if _configured.get(device_type, 0) < count:
        made = max(count, min(at_least, MAX_LOGICAL_CPUS)) if device_type == "CPU" else count
        _set_logical_devices(count, device_type, made)
    return [f"{device_type}:{i}" for i in range(count)]


def _set_logical_devices(count: int, device_type: str, made: int) -> None:
    physical = tf.config.list_physical_devices(device_type)
    if not physical:
        raise UsageError(
            f"--device-type {device_type}: no {device_type} is visible to TensorFlow; use --device-type CPU"
        )
    if device_type == "GPU" and len(physical) >= count:
        _configured[device_type] = len(physical)
        return
    if device_type == "GPU" and len(physical) > 1:
        raise UsageError(f"--devices {count}: this machine has {len(physical)} GPUs; use at most that many")
    already = tf.config.get_logical_device_configuration(physical[0]) or []
    if len(already) >= count:  # set up before us, nothing run yet: kept (a subset serves)
        _configured[device_type] = len(already)
        return
    config = [
        tf.config.LogicalDeviceConfiguration(memory_limit=LOGICAL_GPU_MEMORY_MB if device_type == "GPU" else None)
    ] * made
    try:
        tf.config.set_logical_device_configuration(physical[0], config)
    except RuntimeError:
        existing = len(tf.config.list_logical_devices(device_type))
        if existing >= count:  # set up by the caller before us; a subset serves
            _configured[device_type] = existing
            return
        raise UsageError(
            f"--devices {count}: TensorFlow is already initialised with {existing} "
            f"logical {device_type}s; configure the largest count first, once per "
            f"process, or run in a new process"
        ) from None
    _configured[device_type] = made


def configure_determinism(deterministic: bool) -> None:
    """--deterministic: tf.config.experimental.enable_op_determinism(), for the rest of the process.

    Before any op runs: a kernel already made keeps its algorithm. There is no way back within
    the process, so tests that want it start compare.py in a process of its own.
    """
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def op_determinism_enabled() -> bool:
    """Whether op determinism is on in this process: --deterministic, or TF_DETERMINISTIC_OPS=1 set by the user.

    TensorFlow has no public getter; tensorflow.python.framework.config has had this one since 2.8.
    """
    from tensorflow.python.framework import config as framework_config

    return bool(framework_config.is_op_determinism_enabled())


def one_intra_op_thread(config) -> Dict[str, str]:
    """A distributed trainer's process environment: one intra-op thread on logical CPUs, where N devices on few
    cores otherwise share TensorFlow's default pool of one thread per core and every op waits for its turn
    (docs/throughput.md, "Threads"); nothing on GPUs."""
    return {"TF_NUM_INTRAOP_THREADS": "1"} if config.device_type == "CPU" else {}


def keras_version() -> Optional[str]:
    """The installed Keras's version (Keras 2 with TensorFlow 2.12-2.15, Keras 3 from 2.16), read from its package
    metadata without importing it; None where none is installed."""
    try:
        return importlib.metadata.version("keras")
    except importlib.metadata.PackageNotFoundError:
        return None
