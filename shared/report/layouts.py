"""A Keras model's LayoutMap on the run's DTensor mesh, said before anything trains: the header's lines and the JSON's
`model.layouts`. Each key with the variables it laid out, the keys that matched nothing (a warning, not a refusal:
keras-hub's maps carry keys for optional layers), the variables over 1% of the parameters left whole on a model
axis, the weight bytes per device, and the variables the other Keras release's matching would lay out otherwise
(shared/model/keras_layouts.py). docs/keras.md, "What the tool says of your LayoutMap".
"""

import dataclasses
from typing import List, Optional, Tuple

import numpy as np

from dtensor_vs_mirrored.dtensor_impl.layouts import plan_layouts
from dtensor_vs_mirrored.dtensor_impl.mesh import MeshSpec, parse_mesh
from dtensor_vs_mirrored.shared.devices import keras_version
from dtensor_vs_mirrored.shared.measure.layout_memory import planned_weight_memory
from dtensor_vs_mirrored.shared.measure.memory import MB, largest_total_bytes
from dtensor_vs_mirrored.shared.model.definition import BATCH_AXIS, MODEL_AXIS, ModelDefinition, listed
from dtensor_vs_mirrored.shared.model.keras_layouts import RULE_RELEASES, LayoutAudit
from dtensor_vs_mirrored.shared.model.registry import definition_for
from dtensor_vs_mirrored.shared.training.registry import chosen

LARGE_SHARE = 0.01  # a variable over this share of the parameters, whole on a model axis, is named


@dataclasses.dataclass(frozen=True)
class MeshLayouts:
    """The audited map on the run's DTensor mesh (None: DTensor does not train in this run)."""

    audit: LayoutAudit
    mesh: Optional[MeshSpec]
    specs: Tuple[Tuple[str, ...], ...]  # per variable of the definition, its layout on the mesh
    weight_bytes: int  # the whole model's
    weight_bytes_per_device: Optional[int]  # the busiest device's piece
    replicated: Tuple[Tuple[str, int], ...]  # (Keras path, parameters) over LARGE_SHARE, whole on the model axis


def mesh_layouts(config) -> Optional[MeshLayouts]:
    """The run's model's LayoutMap on its DTensor mesh; None for a model without one."""
    definition = definition_for(config)
    audit = definition.layout_audit
    if audit is None:
        return None
    dtype_bytes = 8 if config.dtype == "float64" else 4
    weight_bytes = definition.parameter_count() * dtype_bytes
    if "dtensor" not in chosen(config) or config.fit:
        return MeshLayouts(audit, None, tuple(v.layout for v in definition.variables), weight_bytes, None, ())
    mesh = parse_mesh(config.mesh, config.devices * config.clients)
    plan = plan_layouts(definition, mesh.batch, mesh.model, config.shard_weights)
    axis_sizes = {BATCH_AXIS: mesh.batch, MODEL_AXIS: mesh.model or 1}
    memory = planned_weight_memory(definition, plan.specs, plan.sizes, axis_sizes, dtype_bytes, config.device_type)
    return MeshLayouts(
        audit, mesh, plan.specs, weight_bytes, largest_total_bytes(memory), replicated(definition, plan.specs, mesh)
    )


def replicated(definition: ModelDefinition, specs, mesh: MeshSpec) -> Tuple[Tuple[str, int], ...]:
    """The variables over LARGE_SHARE of the parameters that no axis splits on a mesh with a model axis."""
    if (mesh.model or 1) == 1:
        return ()
    total = definition.parameter_count()
    return tuple(
        (variable.label or variable.name, size)
        for variable, spec in zip(definition.variables, specs, strict=True)
        if MODEL_AXIS not in spec and (size := int(np.prod(definition.shape(variable)))) > LARGE_SHARE * total
    )


def describe_layouts(config) -> List[str]:
    """The header's lines: the keys and bytes per device, then a warning line each for the keys that matched
    nothing and the large variables left replicated, and a note where the other rule matches otherwise."""
    laid = mesh_layouts(config)
    if laid is None:
        return []
    audit = laid.audit
    used = [
        f"{use.key!r} {axes_text(use.axes)} {len(use.paths)} variable{'s' * (len(use.paths) > 1)}"
        for use in audit.keys
        if use.paths
    ]
    lines = [
        f"layouts: LayoutMap of {len(audit.keys)} keys, matched by {audit.rule} as Keras {keras_version()} does: "
        + (listed(used) or "none matched")
        + per_device(laid)
    ]
    if audit.unmatched:
        lines.append(
            f"warning: LayoutMap key{'s' * (len(audit.unmatched) > 1)} {listed([repr(k) for k in audit.unmatched])} "
            f"matched no variable, so their layouts apply to nothing (fine for a layer this model lacks; else "
            f"compare {'them' if len(audit.unmatched) > 1 else 'it'} with the variables' paths: docs/keras.md)"
        )
    if laid.replicated:
        total = definition_for(config).parameter_count()
        lines.append(
            f"warning: whole on every device of the model axis of {laid.mesh.model} (over 1% of the parameters "
            f"each): "
            + listed([f"{path} ({size:,}, {100 * size / total:.1f}%)" for path, size in laid.replicated])
            + "; give each a LayoutMap key that splits it"
        )
    if audit.differences:
        lines.append(
            f"note: {audit.other_rule} ({RULE_RELEASES[audit.other_rule]}) would lay out otherwise: "
            + listed([difference_text(d) for d in audit.differences])
        )
    return lines


def per_device(laid: MeshLayouts) -> str:
    if laid.mesh is None:
        return ""
    return (
        f"; weights {laid.weight_bytes_per_device / MB:,.2f} MB per device of {laid.weight_bytes / MB:,.2f} MB "
        f"on mesh {laid.mesh}"
    )


def axes_text(axes) -> str:
    return "(" + ", ".join(repr(axis) for axis in axes) + ("," if len(axes) == 1 else "") + ")"


def difference_text(difference) -> str:
    """e.g. "dense_1/kernel by 'dense.*kernel' (here no key)"."""
    there = difference.other_keys
    by = "no key" if not there else (repr(there[0]) if len(there) == 1 else f"{len(there)} keys, an error there")
    here = repr(difference.key) if difference.key is not None else "no key"
    return f"{difference.path} by {by} (here {here})"


def layouts_dict(config) -> Optional[dict]:
    """The JSON's `model.layouts`; None for a model without a LayoutMap."""
    laid = mesh_layouts(config)
    if laid is None:
        return None
    audit = laid.audit
    definition = definition_for(config)
    spec_of = {
        variable.label or variable.name: list(spec)
        for variable, spec in zip(definition.variables, laid.specs, strict=True)
    }
    return {
        "rule": audit.rule,
        "other_rule": audit.other_rule,
        "mesh": None if laid.mesh is None else str(laid.mesh),
        "keys": [
            {
                "key": use.key,
                "axes": list(use.axes),
                "variables": [{"path": path, "layout": spec_of[path]} for path in use.paths],
            }
            for use in audit.keys
        ],
        "unmatched_keys": audit.unmatched,
        "replicated": [{"path": path, "parameters": size} for path, size in laid.replicated],
        "weight_bytes": laid.weight_bytes,
        "weight_bytes_per_device": laid.weight_bytes_per_device,
        "other_rule_differences": [
            {"path": d.path, "key": d.key, "other_keys": list(d.other_keys)} for d in audit.differences
        ],
    }
