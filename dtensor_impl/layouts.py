"""Each variable's DTensor layout on a mesh, and the sizes that zero units pad so that every split divides.

A variable's `layout` (shared/model/definition.py) names a mesh axis per dimension: `model` where the mesh has
a model axis (Megatron's pairs, the ViT's heads), `batch` to split it over the data-parallel devices.
`--shard-weights` adds `batch` to every weight that has none, on the first dimension the batch axis
divides (else the first whose size the model lets zero units pad), as FSDP and ZeRO-3 shard parameters and
optimizer state: DTensor then all-gathers a weight where an op needs it whole and reduce-scatters its
gradient. A weight with no such dimension stays replicated on the batch axis, and `plan_layouts` names it.
Running statistics (non-trainable variables) stay as the model lays them out: they have no optimizer state,
and the step assigns them whole.
"""

import dataclasses
from typing import Dict, List, Optional, Tuple

from dtensor_vs_mirrored.shared.model.definition import BATCH_AXIS, MODEL_AXIS, UNSHARDED, ModelDefinition, Variable
from dtensor_vs_mirrored.shared.model.registry import definition_for


@dataclasses.dataclass(frozen=True)
class LayoutPlan:
    specs: Tuple[Tuple[str, ...], ...]  # per variable, per dimension: "batch", "model" or "unsharded"
    sizes: Dict[str, int]  # the definition's named sizes, padded where a split needs it
    not_split: Tuple[str, ...] = ()  # --shard-weights: the variables the batch axis could not split

    def describe(self, definition: ModelDefinition) -> List[str]:
        """e.g. ["layers/0/w[batch,unsharded]", ...] in the definition's order."""
        return [f"{v.name}[{','.join(spec)}]" for v, spec in zip(definition.variables, self.specs)]


def _length(definition: ModelDefinition, dim) -> int:
    return definition.sizes[dim] if isinstance(dim, str) else dim


def _batch_dim(definition: ModelDefinition, variable: Variable, spec: List[str], batch: int) -> Optional[int]:
    """The dimension --shard-weights splits over the batch axis: the first free one it divides, else the first
    free one the model may pad; None when there is neither."""
    free = [dim for dim, axis in enumerate(spec) if axis == UNSHARDED]
    for dim in free:
        if _length(definition, variable.shape[dim]) % batch == 0:
            return dim
    return next((dim for dim in free if variable.shape[dim] in definition.paddable), None)


def plan_layouts(
    definition: ModelDefinition, batch: int, model: Optional[int], shard_weights: bool = False
) -> LayoutPlan:
    """The layouts of every variable on a batch x model mesh (model None: no model axis), and the padded sizes;
    UsageError naming the variable when a split does not divide and the model allows no padding."""
    axis_sizes = {BATCH_AXIS: batch, MODEL_AXIS: model or 1}
    specs, not_split = [], []
    for variable in definition.variables:
        spec = list(variable.layout) or [UNSHARDED] * len(variable.shape)
        if model is None:  # no model axis on this mesh: what it would split stays whole
            spec = [UNSHARDED if axis == MODEL_AXIS else axis for axis in spec]
        if shard_weights and batch > 1 and BATCH_AXIS not in spec and variable.trainable:
            dim = _batch_dim(definition, variable, spec, batch)
            if dim is None:
                not_split.append(variable.name)
            else:
                spec[dim] = BATCH_AXIS
        specs.append(tuple(spec))
    return LayoutPlan(tuple(specs), definition.padded_sizes(specs, axis_sizes), tuple(not_split))


def layout_plan(config, spec) -> LayoutPlan:
    """The run's model laid out on mesh `spec` (a dtensor_impl.mesh.MeshSpec), --shard-weights applied."""
    return plan_layouts(definition_for(config), spec.batch, spec.model, config.shard_weights)
