"""What the run's speed figures stand for: the device kind and count, and the cores or GPUs behind them.

Logical CPUs are threads of one process sharing the machine's cores: a device adds no compute, so examples/s and
ratios rank configurations on this machine only, while bytes per step and memory per device are properties of
the layouts and carry over to GPUs. On GPUs the same run measures there (docs/approaches.md).
"""

import dataclasses
import os
import re
from typing import Optional

import tensorflow as tf

CPU_INFO = "/proc/cpuinfo"


@dataclasses.dataclass(frozen=True)
class Machine:
    device_type: str  # "CPU" or "GPU"
    logical_devices: int  # the run's largest device count (--devices, --sweep-devices)
    physical_devices: int  # GPUs TensorFlow sees; 1 for CPUs: one processor, its cores shared
    cores: int  # the cores this process may run on
    name: str  # the CPU model or the first GPU's name; "" when unknown

    @property
    def speeds_transfer(self) -> bool:
        """Whether the speeds measured here stand for GPUs: only when they were measured on a GPU each."""
        return self.device_type == "GPU" and self.physical_devices >= self.logical_devices

    def describe(self) -> str:
        """The header's line: what the speed figures stand for."""
        named = f" ({self.name})" if self.name else ""
        if self.device_type == "CPU":
            return (
                f"speeds: {self.logical_devices} logical CPUs sharing {self.cores} cores{named}: a device adds no "
                f"compute, so examples/s and ratios rank configurations on this machine only; bytes per step and "
                f"memory per device carry over to GPUs, CPU speeds do not"
            )
        if self.speeds_transfer:
            return f"speeds: {self.logical_devices} GPUs{named}, one per device: measured on them"
        return (
            f"speeds: {self.logical_devices} logical GPUs split from {self.physical_devices}{named}: they share its "
            f"compute, so speeds rank configurations on this GPU only; bytes per step and memory per device carry over"
        )


def this_machine(device_type: str, logical_devices: int) -> Machine:
    physical = len(tf.config.list_physical_devices(device_type)) if device_type == "GPU" else 1
    return Machine(device_type, logical_devices, physical, _cores(), _name(device_type) or "")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _name(device_type: str) -> Optional[str]:
    if device_type == "GPU":
        gpus = tf.config.list_physical_devices("GPU")
        return tf.config.experimental.get_device_details(gpus[0]).get("device_name") if gpus else None
    try:
        with open(CPU_INFO) as file:
            line = next((line for line in file if line.startswith("model name")), None)
    except OSError:
        return None
    return plain_name(line.split(":", 1)[1]) if line else None


def plain_name(name: str) -> str:
    """A CPU's name without trademark marks: "Intel(R) Xeon(R) Processor" -> "Intel Xeon Processor"."""
    return " ".join(re.sub(r"\((R|TM|C)\)", "", name, flags=re.IGNORECASE).split())
