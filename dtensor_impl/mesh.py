"""The DTensor mesh that `--mesh` asks for, and the checks that reject a bad one.

`--mesh batch=B[,model=M]` (default `batch=N` over the N devices) names a mesh of B x M devices,
batch-major: device b * M + m sits at batch index b, model index m. The batch axis splits the data;
each variable is laid out as its model says where the mesh has the axis (dtensor_impl/layouts.py).
Every check raises `UsageError` with one line that says what would work; `mesh_spec` runs them all
without touching a device, so a caller can fail early.
"""

import dataclasses
from typing import List, Optional, Sequence, Tuple

from tensorflow.experimental import dtensor

from dtensor_vs_mirrored.dtensor_impl import combining
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.model.definition import BATCH_AXIS, MODEL_AXIS

MESH_FORMAT = "batch=B[,model=M]"


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    batch: int  # data shards: the global batch is split over this axis
    model: Optional[int] = None  # None: no model axis (a 1-D mesh)

    @property
    def device_count(self) -> int:
        return self.batch * (self.model or 1)

    @property
    def axes(self) -> List[Tuple[str, int]]:
        """(name, size) pairs, batch first, as dtensor.create_mesh takes them."""
        return [(BATCH_AXIS, self.batch)] + ([(MODEL_AXIS, self.model)] if self.model is not None else [])

    def __str__(self) -> str:
        return f"batch={self.batch}" + (f",model={self.model}" if self.model is not None else "")


def parse_mesh(text: Optional[str], device_count: int) -> MeshSpec:
    """`--mesh` text -> MeshSpec; None means batch=device_count. Checks the syntax only."""
    if text is None:
        return MeshSpec(batch=device_count)
    sizes = {}
    for part in text.replace(" ", "").split(","):
        name, equals, value = part.partition("=")
        if not equals or not value.isdigit() or int(value) < 1:
            raise UsageError(
                f"--mesh {text!r}: {part!r} is not AXIS=SIZE with a positive SIZE; "
                f"use {MESH_FORMAT}, e.g. batch={device_count}"
            )
        if name not in (BATCH_AXIS, MODEL_AXIS):
            raise UsageError(
                f"--mesh {text}: unknown axis {name!r}; the axes are {BATCH_AXIS} and "
                f"{MODEL_AXIS}, e.g. batch={device_count} or {_example_2d(device_count)}"
            )
        if name in sizes:
            raise UsageError(f"--mesh {text}: axis {name} is given twice; use {MESH_FORMAT}")
        sizes[name] = int(value)
    if BATCH_AXIS not in sizes:
        raise UsageError(f"--mesh {text}: no {BATCH_AXIS} axis; use batch=1,{text} for model parallelism only")
    return MeshSpec(batch=sizes[BATCH_AXIS], model=sizes.get(MODEL_AXIS))


def _example_2d(device_count: int) -> str:
    return f"batch={device_count // 2},model=2" if device_count % 2 == 0 else f"batch={device_count}"


def check_mesh(spec: MeshSpec, mesh_text: Optional[str], device_count: int, batch_size: int) -> None:
    """Raise UsageError unless `spec` covers the devices and its batch axis divides the global batch.

    A model axis that does not divide a split width is checked by the model (shared/model/definition.py).
    """
    shown = mesh_text or str(spec)
    if spec.device_count != device_count:
        suggestion = f"batch={device_count}"
        if spec.model is not None and device_count % spec.model == 0:
            suggestion += f" or batch={device_count // spec.model},model={spec.model}"
        elif device_count % 2 == 0:
            suggestion += f" or {_example_2d(device_count)}"
        raise UsageError(
            f"--mesh {shown} covers {spec.device_count} devices but there are {device_count}; "
            f"the axis sizes must multiply to {device_count}, e.g. {suggestion}"
        )
    if batch_size % spec.batch:
        lower, upper = batch_size // spec.batch * spec.batch, (batch_size // spec.batch + 1) * spec.batch
        options = f"{lower} or {upper}" if lower else f"{upper}"
        raise UsageError(
            f"global batch {batch_size} does not divide over the batch axis of {spec.batch} "
            f"(--mesh {shown}); use --batch-size {options}"
        )


def mesh_spec(mesh_text: Optional[str], device_count: int, batch_size: int) -> MeshSpec:
    """Parse and check `--mesh` for `device_count` devices and a global batch."""
    spec = parse_mesh(mesh_text, device_count)
    check_mesh(spec, mesh_text, device_count, batch_size)
    return spec


def every_mesh(device_count: int) -> List[MeshSpec]:
    """Every batch x model factorisation of `device_count`: batch=N first, then growing model axes.

    8 -> batch=8, batch=4,model=2, batch=2,model=4, batch=1,model=8 (the device sweep tries each).
    """
    return [MeshSpec(batch=device_count)] + [
        MeshSpec(batch=device_count // model, model=model)
        for model in range(2, device_count + 1)
        if device_count % model == 0
    ]


def create_mesh(spec: MeshSpec, devices: Sequence[str]) -> dtensor.Mesh:
    """A batch-major mesh over exactly `devices` (e.g. "CPU:0".."CPU:7")."""
    combining.settle(devices[0].split(":")[0])  # before DTensor starts: dtensor_impl/combining.py
    return dtensor.create_mesh(spec.axes, devices=list(devices))


def create_client_mesh(spec: MeshSpec, device_type: str) -> dtensor.Mesh:
    """Multi-client (--clients > 1): the same batch-major mesh over every client's local devices.

    Client c's devices are the c-th block of the batch axis, so it feeds the c-th block
    of every global batch. Needs `dtensor.initialize_accelerator_system` run first, with
    DTENSOR_CLIENT_ID, DTENSOR_NUM_CLIENTS, DTENSOR_JOB_NAME and DTENSOR_JOBS set.
    """
    return dtensor.create_distributed_mesh(spec.axes, device_type=device_type)


def batch_layout(mesh: dtensor.Mesh, rank: int) -> dtensor.Layout:
    """Data: the first (example) axis split over the batch axis, replicated over the model axis."""
    return dtensor.Layout.batch_sharded(mesh, BATCH_AXIS, rank)
