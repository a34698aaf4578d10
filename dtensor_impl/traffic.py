"""The bytes each mesh device sends per DTensor train step (--profile), counted in the functions that ran.

The collectives of the function DTensor lowered a train call to (the program every mesh device runs), with
their shapes, dtypes, group sizes and the mesh axis each group spans; link bytes as shared/measure/traffic.py
counts a ring. What it assumes and leaves out: docs/throughput.md.
"""

from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from dtensor_vs_mirrored.shared.measure.traffic import COLLECTIVE_KINDS, Collective, DeviceTraffic, Traffic, ring_bytes


def _function_def(name: str):
    from tensorflow.python.eager import context

    return context.context().get_function_def(name)


def _called_functions(function_def) -> List[str]:
    names = []
    for node in function_def.node_def:
        for value in node.attr.values():
            if value.HasField("func"):
                names.append(value.func.name)
            names += [func.name for func in value.list.func]
    return names


def lowered_functions(concrete_function) -> List[str]:
    """The functions DTensor lowered `concrete_function` to (each mesh device runs them), found in the eager
    context's library: "<its name>__func_..." calls "_func_...". Empty before its first call (DTensor lowers
    a function when it first runs it) or where this TensorFlow names them otherwise."""
    from tensorflow.python.eager import context

    root = _name(concrete_function)
    return sorted(name for name in context.context().list_function_names() if name.startswith(root + "__func_"))


def _name(concrete_function) -> str:
    name = concrete_function.name
    return name.decode() if isinstance(name, bytes) else name


def _const_value(nodes: Dict[str, object], tensor_name: str) -> np.ndarray:
    """The constant a tensor comes from, through the Reshape/Slice of it that DTensor emits."""
    from tensorflow.python.framework import tensor_util

    node = nodes[tensor_name.split(":")[0]]
    while node.op != "Const":
        node = nodes[node.input[0].split(":")[0]]
    return tensor_util.MakeNdarray(node.attr["value"].tensor)


def group_axes(group_keys: np.ndarray, mesh_axes: Sequence[Tuple[str, int]]) -> str:
    """The mesh axes along which the devices of one group differ ("batch", "model", "batch,model").

    `group_keys[d]` is device d's group key (devices batch-major, as DTensor numbers them): devices with
    the same key reduce together.
    """
    coordinates = np.array(np.unravel_index(np.arange(len(group_keys)), [size for _, size in mesh_axes])).T
    varying = set()
    for key in np.unique(group_keys):
        members = coordinates[group_keys == key]
        varying |= {index for index in range(members.shape[1]) if len(np.unique(members[:, index])) > 1}
    return ",".join(name for index, (name, _) in enumerate(mesh_axes) if index in varying) or "none"


def dtensor_traffic(
    concrete_function, steps: int, mesh_axes: Sequence[Tuple[str, int]], devices: Sequence[str]
) -> Tuple[Optional[Traffic], str]:
    """(Traffic per step, "") from the collectives in what DTensor lowered `concrete_function` (a call of
    `steps` steps, already run) to; (None, why) when that function is not found."""
    wrappers = lowered_functions(concrete_function)
    if len(wrappers) != 1:
        return None, f"found {len(wrappers)} functions that DTensor lowered {_name(concrete_function)} to, not one"
    found: Dict[Tuple[str, str, int], List[int]] = defaultdict(lambda: [0, 0])  # (kind, axes, g) -> count, bytes
    pending, seen = [wrappers[0]], set()
    while pending:
        function_def = _function_def(pending.pop())
        nodes = {node.name: node for node in function_def.node_def}
        for node in function_def.node_def:
            kind = COLLECTIVE_KINDS.get(node.op)
            if kind is None:
                continue
            shapes = node.attr["_output_shapes"].list.shape
            if not shapes or any(dim.size < 0 for dim in shapes[0].dim):
                return None, f"collective {node.name} has no static shape"
            output_bytes = int(np.prod([dim.size for dim in shapes[0].dim])) * tf.as_dtype(node.attr["T"].type).size
            group_size = int(_const_value(nodes, node.input[1]))
            payload = (
                output_bytes // group_size
                if kind == "all-gather"
                else (output_bytes * group_size if kind == "reduce-scatter" else output_bytes)
            )
            axes = group_axes(_const_value(nodes, node.input[2]).reshape(-1), mesh_axes)
            entry = found[(kind, axes, group_size)]
            entry[0] += 1
            entry[1] += payload
        for name in _called_functions(function_def):
            if name not in seen:
                seen.add(name)
                pending.append(name)
    collectives = [
        Collective(kind, axes, group_size, count // steps, payload // steps)
        for (kind, axes, group_size), (count, payload) in sorted(found.items())
    ]
    per_device = int(round(sum(ring_bytes(c.kind, c.payload_bytes, c.group_size) for c in collectives)))
    return Traffic(
        f"the collectives DTensor lowered a call of {steps} step{'s' * (steps != 1)} to",
        collectives,
        [DeviceTraffic(device, per_device, per_device) for device in devices],
    ), ""
