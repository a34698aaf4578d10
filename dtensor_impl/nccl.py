"""DTensor's NCCL switch: whether its collectives use NCCL in this process, decided once, before TensorFlow starts.

DTensor uses NCCL on GPUs only when DTENSOR_GPU_USE_NCCL_COMMUNICATION is set (default "0": TensorFlow's
own ring collectives), where MirroredStrategy picks NCCL by itself; so a GPU comparison with the default
compares DTensor's fallback with MirroredStrategy's NCCL. The setting takes effect in two places, each
read once per process: DTensor's C++ lowering (a static, at its first GPU collective) and the runtime's
collective configuration (`collective_nccl`), which TensorFlow reads when its runtime starts;
`dtensor.initialize_accelerator_system` sets both from the variable, but this project's one-process
trainer builds its mesh without it. So `settle` runs before anything starts the runtime (compare.py's
`prepare`, a --clients client's join) and sets both, as initialize_accelerator_system does: NCCL on
wherever TensorFlow allows it (one physical GPU per device), off with --no-dtensor-nccl. If the runtime
had started before (your own TensorFlow code in the process), it changes nothing and reports what the
runtime was configured with. CPUs have no NCCL.
"""

import os
from typing import Dict, Mapping, Optional, Tuple

from dtensor_vs_mirrored.shared.measure.traffic import Implementation

VARIABLE = "DTENSOR_GPU_USE_NCCL_COMMUNICATION"
_setting: Optional[Implementation] = None  # what this process's DTensor collectives use; None until `settle`


def _runtime_started() -> bool:
    """Has TensorFlow's runtime started in this process? A private attribute that TensorFlow 2.12 to 2.21
    all have; without it, assume it has."""
    from tensorflow.python.eager import context

    return bool(getattr(context.context(), "_initialized", True))


def _runtime_nccl() -> bool:
    """What the runtime's collectives are (or will be) configured with: True for NCCL on GPUs."""
    from tensorflow.python.eager import context

    return bool(getattr(context.context(), "_collective_use_nccl_communication", False))


def decide(
    device_type: str,
    device_count: int,
    wanted: bool,
    physical_gpus: int,
    runtime_started: bool,
    environ: Mapping[str, str],
    runtime_nccl: bool = False,
) -> Tuple[Implementation, Dict[str, str]]:
    """(what DTensor's collectives will use, the variables to set) for this process's facts."""
    if device_type != "GPU":
        return Implementation("ring", False, "CPUs have no NCCL"), {}
    if runtime_started:
        on = runtime_nccl and environ.get(VARIABLE, "0") not in ("0", "")
        return Implementation("NCCL" if on else "ring", on, "TensorFlow had started before: as it was set"), {}
    if not wanted:
        return Implementation("ring", False, "--no-dtensor-nccl"), {VARIABLE: "0"}
    if physical_gpus < device_count:
        return Implementation(
            "ring", False, f"{device_count} logical GPUs on {physical_gpus} physical: NCCL needs one each"
        ), {VARIABLE: "0"}
    if environ.get(VARIABLE) == "0":
        return Implementation("ring", False, f"{VARIABLE}=0 set by you"), {}
    return Implementation("NCCL", True, "one physical GPU per device"), {VARIABLE: "1"}


def settle(
    device_type: str, device_count: int, wanted: bool = True, physical_gpus: Optional[int] = None
) -> Implementation:
    """Fix DTensor's NCCL for this process, the first time it is called; return what its collectives use.
    `physical_gpus`: None counts them."""
    global _setting
    if _setting is None:
        if physical_gpus is None:
            import tensorflow as tf

            physical_gpus = len(tf.config.list_physical_devices("GPU"))  # does not start the runtime
        _setting, variables = decide(
            device_type, device_count, wanted, physical_gpus, _runtime_started(), os.environ, _runtime_nccl()
        )
        os.environ.update(variables)
        if _setting.nccl:
            from tensorflow.python.eager import context

            # What dtensor.initialize_accelerator_system does on one host (accelerator_util.py): the runtime's
            # collectives take NCCL on GPUs; read when the runtime starts.
            context.context()._collective_use_nccl_communication = True
    return _setting
