"""DTensor as the run sees it: its checks, header facts, sweep variants, trainer process, --clients and bytes
counting, registered with shared/training/registry.py as SPEC."""

from typing import Dict, List, Sequence, Tuple

import tensorflow as tf

from dtensor_vs_mirrored.dtensor_impl import combining, nccl
from dtensor_vs_mirrored.dtensor_impl.cluster import CLUSTER
from dtensor_vs_mirrored.dtensor_impl.inputs import check_input_mode, pack_batch
from dtensor_vs_mirrored.dtensor_impl.layouts import layout_plan
from dtensor_vs_mirrored.dtensor_impl.mesh import MeshSpec, every_mesh, mesh_spec, parse_mesh
from dtensor_vs_mirrored.dtensor_impl.trainer import DTensorTrainer
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.devices import one_intra_op_thread
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.measure.history import History
from dtensor_vs_mirrored.shared.training.protocol import RunFacts, TrainerSpec, Variant

FLOAT64_ALL_REDUCE_SINCE = (2, 13)  # measured: 2.12.1 fails, 2.13.1 to 2.21.0 pass (docs/releases.md)
FLOAT64_ALL_GATHER_SINCE = (2, 14)  # measured: 2.13.1 fails, 2.14.1 to 2.21.0 pass


def check_config(config: Config, devices: Sequence[str]) -> MeshSpec:
    """The mesh, input-mode, --clients and float64 checks, run before anything trains."""
    # --clients: `devices` are this client's; the mesh spans every client's (shared/run/clients.py).
    spec = mesh_spec(config.mesh, len(devices) * config.clients, config.batch_size)
    if config.clients > 1 and config.dtensor_input != "pack":
        raise UsageError(
            f"--dtensor-input {config.dtensor_input} is not supported with --clients "
            f"{config.clients}; use --dtensor-input pack (each client packs its own shards)"
        )
    check_input_mode(config.dtensor_input, len(devices), devices[0].split(":")[0])
    check_float64_collectives(config.dtype, spec, config.shard_weights)
    if config.shard_weights and spec.batch == 1:
        raise UsageError(
            f"--shard-weights splits weights over the batch axis, and mesh {spec} has a batch axis of 1; "
            f"use a mesh with batch > 1, e.g. batch={spec.device_count}, or drop --shard-weights"
        )
    layout_plan(config, spec)  # a width an axis cannot split, and no padding: one line
    return spec


def tensorflow_release() -> Tuple[int, int]:
    return tuple(int(part) for part in tf.__version__.split(".")[:2])


def float64_collectives_since(spec: MeshSpec, shard_weights: bool = False) -> Tuple[int, int]:
    """The oldest release whose DTensor collectives carry float64 on this mesh: 2.12's all-reduce has none, and
    every mesh of more than one device all-reduces; 2.13's all-gather has none, and weights split on the batch axis
    all-gather (a model axis no longer does: the weights are read back per device, dtensor_impl/variables.py;
    docs/releases.md)."""
    if shard_weights and spec.batch > 1:
        return FLOAT64_ALL_GATHER_SINCE
    return FLOAT64_ALL_REDUCE_SINCE if spec.device_count > 1 else (0, 0)


def check_float64_collectives(dtype: str, spec: MeshSpec, shard_weights: bool = False) -> None:
    """One line instead of DTensor's MLIR error when this release cannot run float64 on this mesh."""
    needed = float64_collectives_since(spec, shard_weights)
    if dtype == "float64" and tensorflow_release() < needed:
        raise UsageError(
            f"--dtype float64 on DTensor mesh {spec} needs TensorFlow "
            f"{'.'.join(map(str, needed))} or later (this is {tf.__version__}: its DTensor "
            f"collectives have no float64); use --dtype float32 or a newer TensorFlow"
        )


def process_environment(config: Config) -> Dict[str, str]:
    """Its trainer process's environment: one intra-op thread on CPUs, and the all-reduce combining for a model of
    many variables (combining.py)."""
    return {**one_intra_op_thread(config), **combining.environment(config)}


def before_runtime(config: Config, device_count: int) -> None:
    """What must be fixed before TensorFlow's runtime starts in this process: DTensor's NCCL (nccl.py)."""
    nccl.settle(config.device_type, device_count, config.dtensor_nccl)


def describe_run(config: Config) -> RunFacts:
    """The header's facts, before anything trains (--clients: the mesh spans every client's devices)."""
    spec = parse_mesh(config.mesh, config.devices * config.clients)
    sharded = ", weights and optimizer slots split on the batch axis" if config.shard_weights else ""
    return RunFacts(f"DTensor mesh {spec}{sharded}", f"{config.batch_size // spec.batch} (DTensor)")


# A sharded configuration traces its step twice (DTensorTrainer.choose_forward, --sharded-forward auto), so it
# trains about half as long again as an unsharded one (the GPT's, two at a time on 2 cores: docs/measurements.md).
SHARDED_COST = 1.5


def variants(config: Config, count: int, every_layout: bool, meshes: Sequence[str] = ()) -> List[Variant]:
    """Its configurations at `count` devices: every mesh (batch x model) for the sweep, each replicated and then
    with its weights split on a batch axis of 2 or more; or batch=N only; the Python API's `meshes` each."""
    if meshes:
        return [Variant(f"dtensor {mesh}", config.replace(devices=count, mesh=mesh), mesh=mesh) for mesh in meshes]
    if every_layout:
        layouts = [
            (spec, shard) for spec in every_mesh(count) for shard in ((False, True) if spec.batch > 1 else (False,))
        ]
    else:
        layouts = [(MeshSpec(batch=count), config.shard_weights and count > 1)]
    return [
        Variant(
            "dtensor",
            config.replace(devices=count, mesh=str(spec), shard_weights=shard),
            mesh=str(spec),
            shard_weights=shard,
            cost=SHARDED_COST if shard else 1.0,
        )
        for spec, shard in layouts
    ]


def pinned(config: Config, history: History) -> Config:
    """Its float64 rerun's configuration: the forward its float32 run chose for the weights split on the batch axis
    (--sharded-forward), so that the rerun computes that same program and traces no step the other way."""
    if "weights_all_gathered" in history.details:
        return config.replace(sharded_forward="gather")
    if "weights_expanded" in history.details:
        return config.replace(sharded_forward="expand")
    return config


def count_bytes(trainer: DTensorTrainer):
    """The bytes its steady call's collectives send per device, from the lowered functions."""
    packed = [pack_batch(x, y, trainer.mesh, trainer.pad_to) for x, y in trainer.steady_group()]
    return trainer.call_traffic(trainer.model, trainer.optimizer, packed, False, trainer.steps_give_gradients)


SPEC = TrainerSpec(
    "dtensor",
    DTensorTrainer,
    check_config=check_config,
    variants=variants,
    process_environment=process_environment,
    before_runtime=before_runtime,
    describe_run=describe_run,
    cluster=CLUSTER,
    count_bytes=count_bytes,
    options={
        "mesh": "shapes DTensor's mesh",
        "dtensor_input": "chooses DTensor's input",
        "dtensor_nccl": "keeps DTensor's collectives off NCCL",
        "shard_weights": "lays out DTensor's weights",
        "sharded_forward": "chooses DTensor's forward of weights split on the batch axis",
    },
    pinned=pinned,
)
