"""MirroredStrategy as the run sees it: its checks, header facts, sweep variants, trainer process, --clients
and bytes counting, registered with shared/training/registry.py as SPEC."""

from typing import List, Sequence

import tensorflow as tf

from dtensor_vs_mirrored.mirrored_impl.cluster import CLUSTER
from dtensor_vs_mirrored.mirrored_impl.fit_cautions import fit_cautions, rebatch_pieces
from dtensor_vs_mirrored.mirrored_impl.inputs import describe_pieces
from dtensor_vs_mirrored.mirrored_impl.keras_fit import MirroredFitTrainer
from dtensor_vs_mirrored.mirrored_impl.trainer import UPDATE_MODES, MirroredTrainer, train_step, update_mode
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.devices import one_intra_op_thread
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.measure import traffic
from dtensor_vs_mirrored.shared.training.protocol import RunFacts, TrainerSpec, Variant


def check_config(config: Config, devices: Sequence[str]) -> None:
    """Reject devices TensorFlow cannot provide, global batches smaller than the replica count, and the primary
    update across processes; run before anything trains."""
    batch_size = config.batch_size
    if config.clients > 1:  # MultiWorkerMirroredStrategy: one replica per worker on CPU
        if config.mirrored_update == "primary":
            raise UsageError(
                f"--mirrored-update primary needs one process, not --clients {config.clients}; "
                f"use --mirrored-update replicas (or auto)"
            )
        if batch_size < config.clients:
            raise UsageError(
                f"--batch-size {batch_size} is smaller than the {config.clients} workers; "
                f"use --batch-size {config.clients} or more"
            )
        return
    device_type = devices[0].split(":")[0]
    configured = {device.name.replace("/device:", "") for device in tf.config.list_logical_devices()}
    missing = [device for device in devices if device not in configured]
    if missing:
        available = len(tf.config.list_logical_devices(device_type))
        raise UsageError(
            f"--devices {len(devices)}: {', '.join(missing)} not configured; TensorFlow "
            f"has {available} logical {device_type}s, use --devices {available} or fewer"
        )
    if batch_size < len(devices):
        raise UsageError(
            f"--batch-size {batch_size} is smaller than the {len(devices)} replicas, so some "
            f"replicas would never see an example; use --batch-size {len(devices)} or more, "
            f"or --devices {batch_size} or fewer"
        )


def describe_run(config: Config) -> RunFacts:
    """The header's facts: MultiWorkerMirroredStrategy has one replica per worker (--clients)."""
    replicas = config.clients if config.clients > 1 else config.devices
    if config.fit:  # tf.data's rebatch cuts Keras's batches: ceil(batch / replicas) each, the last the rest
        pieces = rebatch_pieces(config.batch_size, replicas)
        shown = f"{pieces[0]}" if len(set(pieces)) == 1 else f"{min(pieces)}-{max(pieces)}"
        return RunFacts("", f"{shown} (model.fit under MirroredStrategy)")
    return RunFacts("", f"{describe_pieces(config.batch_size, replicas)} (MirroredStrategy)")


# Against DTensor's plain configuration: MirroredStrategy traces its step once per replica, and "replicas" compiles
# its update on each (the GPT at 8 devices: primary 13-17 s, replicas 22-25 s, DTensor batch=8 11-18 s).
UPDATE_COSTS = {"primary": 1.0, "replicas": 1.4}


def variants(config: Config, count: int, every_layout: bool, meshes: Sequence[str] = ()) -> List[Variant]:
    """Its configurations at `count` devices: each update mode for the sweep, or the run's own."""
    if config.fit:  # model.fit updates as Keras does
        return [Variant("mirrored", config.replace(devices=count))]
    updates = UPDATE_MODES if every_layout and not meshes else (update_mode(config),)
    return [
        Variant(
            "mirrored",
            config.replace(devices=count, mirrored_update=update, shard_weights=False),
            update=update,
            cost=UPDATE_COSTS[update],
        )
        for update in updates
    ]


def count_bytes(trainer: MirroredTrainer):
    """The bytes the cross-device copies of its train step send per device, from the traced graph."""
    step = train_step.get_concrete_function(
        trainer.strategy, trainer.model, trainer.optimizer, trainer.chunk, tf.constant(0), trainer.primary_model
    )
    return traffic.cross_device_traffic(step)


SPEC = TrainerSpec(
    "mirrored",
    MirroredTrainer,
    check_config=check_config,
    variants=variants,
    process_environment=one_intra_op_thread,
    describe_run=describe_run,
    cluster=CLUSTER,
    count_bytes=count_bytes,
    fit_trainer=MirroredFitTrainer,  # model.fit under this strategy
    fit_cautions=fit_cautions,
    options={"mirrored_update": "chooses MirroredStrategy's optimizer step"},
)
