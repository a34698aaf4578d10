"""The model and optimizer as DVariables on a mesh, and their values back on the host.

Initial values are drawn once on the host and copied whole to every device, then sliced to each layout (a
random op under a sharded layout would draw other numbers than the reference). A width an axis does not
divide gets zero units where the model allows (dtensor_impl/layouts.py); checkpoints hold the unpadded model,
so with padding an unpadded copy on the host is what they read and write.
"""

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from dtensor_vs_mirrored.dtensor_impl.classes import whole_classes
from dtensor_vs_mirrored.dtensor_impl.layouts import LayoutPlan, plan_layouts
from dtensor_vs_mirrored.dtensor_impl.mesh import BATCH_AXIS
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.model.definition import MODEL_AXIS, UNSHARDED, Model
from dtensor_vs_mirrored.shared.training.optim import make_optimizer


def on_mesh(value: np.ndarray, layout: dtensor.Layout):
    """`value` copied whole to every device, then sliced to `layout`: the same numbers for any layout."""
    replicated = dtensor.copy_to_mesh(tf.constant(value), dtensor.Layout.replicated(layout.mesh, layout.rank))
    return dtensor.relayout(replicated, layout)


def to_numpy(tensor) -> np.ndarray:
    """A DTensor (or DVariable) as one array, assembled on the host from its per-device pieces (`dtensor.unpack`):
    no collective runs, so no two-axis gather either (a relayout to replicated of a [model, batch] tensor came back
    out of order under the CollectiveGatherV2 lowering: gathering.py). A mesh with devices on other clients cannot
    be assembled here: that tensor is relaid out to replicated, and one device's copy read."""
    tensor = tf.convert_to_tensor(tensor)
    layout = dtensor.fetch_layout(tensor)
    mesh = layout.mesh
    if mesh.num_local_devices() != mesh.size:  # --clients: the other pieces live in other processes
        return dtensor.relayout(tensor, dtensor.Layout.replicated(mesh, layout.rank)).numpy()
    assembled = None
    for piece, location in zip(dtensor.unpack(tensor), mesh.local_device_locations()):
        piece = piece.numpy()
        if assembled is None:
            assembled = np.empty(
                [size * _pieces(mesh, axis) for size, axis in zip(piece.shape, layout.sharding_specs)], piece.dtype
            )
        assembled[tuple(_slice(location, axis, size) for size, axis in zip(piece.shape, layout.sharding_specs))] = piece
    return assembled


def _pieces(mesh: dtensor.Mesh, axis: str) -> int:
    return 1 if axis == UNSHARDED else mesh.dim_size(axis)


def _slice(location, axis: str, size: int) -> slice:
    """Where a device's piece sits along one dimension: its index on the mesh axis that splits it."""
    return slice(None) if axis == UNSHARDED else slice(location[axis] * size, (location[axis] + 1) * size)


def build_model(
    definition,
    values: Sequence[np.ndarray],
    mesh: dtensor.Mesh,
    plan: Optional[LayoutPlan] = None,
    gather: bool = False,
    seed: int = 0,
    compute_dtype: Optional[str] = None,
) -> Model:
    """The model's variables as DVariables holding `values`, each in its planned layout on `mesh`.

    A weight split on the batch axis is left to DTensor's SPMD expansion; with `gather` the forward all-gathers
    each such weight where it reads it, as FSDP does: the fallback for a model DTensor cannot expand otherwise
    (docs/throughput.md, "Sharded data parallel"). Its logits come out with the classes whole (classes.py)."""
    if plan is None:  # the model's own layouts on this mesh
        model_axis = mesh.dim_size(MODEL_AXIS) if MODEL_AXIS in mesh.dim_names else None
        plan = plan_layouts(definition, mesh.dim_size(BATCH_AXIS), model_axis)
    layouts = {
        variable.name: dtensor.Layout(list(spec), mesh) for variable, spec in zip(definition.variables, plan.specs)
    }
    gathered = {
        variable.name: dtensor.Layout([UNSHARDED if axis == BATCH_AXIS else axis for axis in spec], mesh)
        for variable, spec in zip(definition.variables, plan.specs)
        if gather and BATCH_AXIS in spec
    }

    def all_gathered(weight, variable):
        return dtensor.relayout(weight, gathered[variable.name]) if variable.name in gathered else weight

    return Model(
        definition,
        values,
        lambda value, variable: dtensor.DVariable(on_mesh(value, layouts[variable.name]), trainable=variable.trainable),
        all_gathered if gathered else None,
        seed,
        compute_dtype=compute_dtype,  # a mixed policy's: each weight, sharded or gathered, cast where read
        output=whole_classes(mesh),
    )


def build_optimizer(config: Config, model: Model, mesh: dtensor.Mesh):
    """The shared Adam/SGD; Adam's m and v slots take their weight's layout, the step (and --clip-global-norm's count)
    is replicated."""
    return make_optimizer(
        config,
        model.trainable,
        zeros_like=lambda var: dtensor.DVariable(
            dtensor.call_with_layout(tf.zeros, var.layout, shape=var.shape, dtype=var.dtype)
        ),
        make_step=lambda: dtensor.DVariable(
            dtensor.call_with_layout(tf.zeros, dtensor.Layout.replicated(mesh, 0), shape=(), dtype=tf.int64)
        ),
        choice=model.definition.optimizer,  # a compiled Keras Adam or SGD
    )


def reset(model: Model, optimizer, values: Sequence[np.ndarray]) -> None:
    """The weights back to `values`, the optimizer's state to zero."""
    for weight, value in zip(model.weights, values, strict=True):
        weight.assign(on_mesh(value, weight.layout))
    for variable in optimizer.variables:
        variable.assign(dtensor.call_with_layout(tf.zeros, variable.layout, shape=variable.shape, dtype=variable.dtype))


def copy_to_host(model: Model, optimizer, host_model: Model, host_optimizer) -> None:
    """The padded mesh model's weights and optimizer state into the unpadded host copy (cut to its shapes).

    tf.Module lists an optimizer's variables in attribute order, the same for both copies.
    """
    for source, target in zip(
        [*model.weights, *optimizer.variables], [*host_model.weights, *host_optimizer.variables], strict=True
    ):
        target.assign(to_numpy(source)[tuple(slice(0, size) for size in target.shape)])


def copy_from_host(host_model: Model, host_optimizer, model: Model, optimizer) -> None:
    """The unpadded host copy (e.g. just restored) into the padded mesh model, zero-padded to its shapes."""
    for source, target in zip(
        [*host_model.weights, *host_optimizer.variables], [*model.weights, *optimizer.variables], strict=True
    ):
        value = source.numpy()
        if value.ndim:  # not the scalar step count
            value = np.pad(value, [(0, size - have) for size, have in zip(target.shape, value.shape)])
        target.assign(on_mesh(value, target.layout))
