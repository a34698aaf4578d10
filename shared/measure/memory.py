"""Memory per device: the bytes of weights and of optimizer state that each device holds.

Each trainer counts them from its live objects (its own `memory_per_device`): the
reference's variables, each MirroredVariable's per-replica copies (and, with
`--mirrored-update primary`, the first device's plain copy and its optimizer), each
DVariable's per-device components (`dtensor.unpack`). This module only adds them up per
device and formats them; what a layout costs is then read off the live run, not derived.
Optimizer state is Adam's m and v slots and its int64 step count (8 bytes per device that
holds a copy); SGD has none. On GPU, `with_peaks` adds TensorFlow's peak allocation.
"""

import dataclasses
import os
import resource
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import tensorflow as tf

MB = 2**20  # as the results table's other MB columns


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    device: str  # e.g. "CPU:3"
    weight_bytes: int
    optimizer_bytes: int
    peak_bytes: Optional[int] = None  # GPU only: TensorFlow's peak allocation on the device during the run

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.optimizer_bytes


def short_device(name: str) -> str:
    """ "/job:localhost/replica:0/task:0/device:CPU:3" -> "CPU:3"."""
    spec = tf.DeviceSpec.from_string(name)
    return f"{spec.device_type}:{spec.device_index}"


def located_bytes(tensors: Iterable) -> List[Tuple[str, int]]:
    """(device, bytes) of each tensor or variable, from its own shape, dtype and device."""
    return [(short_device(t.device), t.shape.num_elements() * t.dtype.size) for t in tensors]


def tally(weights: Sequence[Tuple[str, int]], optimizer_state: Sequence[Tuple[str, int]]) -> List[DeviceMemory]:
    """Per device, in device order: the summed (device, bytes) pairs of weights and of optimizer state."""
    totals: Dict[str, List[int]] = {}
    for index, pairs in enumerate((weights, optimizer_state)):
        for device, size in pairs:
            totals.setdefault(device, [0, 0])[index] += size
    order = sorted(totals, key=lambda name: (name.split(":")[0], int(name.split(":")[1])))
    return [DeviceMemory(device, *totals[device]) for device in order]


def with_peaks(memory: Sequence[DeviceMemory], peaks: Dict[str, int]) -> List[DeviceMemory]:
    """The records with `peak_bytes` from {device: TensorFlow's peak allocation} (GPU)."""
    return [dataclasses.replace(record, peak_bytes=peaks.get(record.device)) for record in memory]


def largest_total_bytes(memory: Sequence[DeviceMemory]) -> int:
    """What the busiest device holds (weights + optimizer state); 0 for no record."""
    return max((record.total_bytes for record in memory), default=0)


def describe(memory: Sequence[DeviceMemory]) -> str:
    """One line, devices with equal holdings grouped: "CPU:0 1.45 + 2.90 MB, CPU:1-7 0.37 + 0.73 MB each"."""
    groups: List[Tuple[List[str], DeviceMemory]] = []
    for record in memory:
        if groups and (groups[-1][1].weight_bytes, groups[-1][1].optimizer_bytes) == (
            record.weight_bytes,
            record.optimizer_bytes,
        ):
            groups[-1][0].append(record.device)
        else:
            groups.append(([record.device], record))
    parts = []
    for devices, record in groups:
        name = devices[0] if len(devices) == 1 else f"{devices[0]}-{devices[-1].split(':')[1]}"
        parts.append(
            f"{name} {record.weight_bytes / MB:.2f} + {record.optimizer_bytes / MB:.2f} MB"
            + (" each" if len(devices) > 1 else "")
        )
    return ", ".join(parts) + " (weights + optimizer state)" if parts else "-"


# Linux: writing "5" here resets this process's peak RSS (VmHWM in /proc/self/status) to what it holds now, so that a
# reading after a trainer is the peak while it trained, not the largest of everything before it (proc(5)). Not
# ru_maxrss: a spawned process inherits its parent's there, and the reset leaves it.
PEAK_RESET_FILE = "/proc/self/clear_refs"
STATUS_FILE = "/proc/self/status"


def _status_kib(field: str) -> Optional[int]:
    """A "VmRSS:"-style line of /proc/self/status in KiB; None where there is none."""
    try:
        with open(STATUS_FILE) as file:
            return next(int(line.split()[1]) for line in file if line.startswith(field))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def can_reset_peak() -> bool:
    """Whether this process can reset its peak RSS (start_peak)."""
    return os.access(PEAK_RESET_FILE, os.W_OK) and _status_kib("VmHWM:") is not None


def start_peak() -> Optional[float]:
    """Before a trainer: reset this process's peak RSS and return the RSS now in MB, its baseline; None where the
    system cannot reset it (the peak is then the process's so far)."""
    try:
        with open(PEAK_RESET_FILE, "w") as file:
            file.write("5")
    except OSError:
        return None
    rss_kib = _status_kib("VmRSS:")
    return None if rss_kib is None else rss_kib / 1024


def peak_rss_mb() -> float:
    """This process's peak RSS since the last start_peak (else since it started), in MB."""
    peak_kib = _status_kib("VmHWM:")
    if peak_kib is None:  # no /proc: the process's peak so far
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return peak_kib / 1024
