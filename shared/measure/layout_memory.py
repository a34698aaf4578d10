"""The weight bytes each device of a DTensor mesh will hold under a layout plan, known before anything trains: what
a LayoutMap's audit (shared/report/layouts.py) shows beside its keys. Summed per device as the trainers sum what
their live variables hold (shared/measure/memory.py tally), so the figure is the one the results' memory/device
column later measures, less the optimizer state.
"""

from typing import List, Mapping, Sequence

import numpy as np

from dtensor_vs_mirrored.shared.measure.memory import DeviceMemory, tally
from dtensor_vs_mirrored.shared.model.definition import ModelDefinition


def planned_weight_memory(
    definition: ModelDefinition,
    specs: Sequence[Sequence[str]],
    sizes: Mapping[str, int],
    axis_sizes: Mapping[str, int],
    dtype_bytes: int,
    device_type: str = "CPU",
) -> List[DeviceMemory]:
    """Per device of a mesh of `axis_sizes` ({"batch": B, "model": M}), in device order: the bytes of its piece of
    every variable laid out as `specs` says (an axis or "unsharded" per dimension), the named sizes padded to
    `sizes`. A split divides its dimension (the plan padded it or refused it), so every device holds alike."""
    count = int(np.prod(list(axis_sizes.values())))
    pieces = []
    for variable, spec in zip(definition.variables, specs, strict=True):
        elements = int(np.prod(definition.shape(variable, sizes)))
        split = int(np.prod([axis_sizes.get(axis, 1) for axis in spec]))
        pieces += [(f"{device_type}:{device}", elements // split * dtype_bytes) for device in range(count)]
    return tally(pieces, [])
