"""The run's facts, printed once before anything trains: devices, batches, optimizer, data and model."""

from typing import Dict, List, Sequence

import numpy as np
import tensorflow as tf

from shared.console import fit_width
from shared.measure.machine import Machine, this_machine
from shared.model.registry import definition_for
from shared.training.protocol import RunFacts


def header(config, devices: Sequence[str], data, facts: Dict[str, RunFacts], processes: str = "") -> str:
    """The run's facts, once: devices, what each trainer that runs adds (its mesh, its per-replica batch;
    `facts`: shared.training.registry.describe_runs), and where they train (`processes`, when not all here)."""
    devices_notes = "".join(f"; {fact.devices}" for fact in facts.values() if fact.devices)
    per_replica = [fact.per_replica_batch for fact in facts.values() if fact.per_replica_batch]
    return "\n".join(
        fit_width(line, indent=2)
        for line in [
            f"TensorFlow {tf.__version__}; {len(devices)} logical {config.device_type} devices "
            f"({devices[0]} .. {devices[-1]})"
            + (f" per client x {config.clients} clients" if config.clients > 1 else "")
            + devices_notes,
            f"global batch {config.batch_size}"
            + (f", per replica {' / '.join(per_replica)}" if per_replica else "")
            + f"; {config.epochs} epoch{'s' * (config.epochs != 1)}",
            f"{config.optimizer} lr {config.learning_rate:g}"
            + (f" ({config.adam} Adam)" if config.optimizer == "adam" else "")
            + f"; {config.dtype}; seed {config.seed}",
            data.describe(),
            describe_model(definition_for(config)),
        ]
        + describe_cautions(definition_for(config))
        + ([processes] if processes else [])
        + [run_machine(config).describe()]
    )


def run_machine(config) -> Machine:
    """The machine the run's speeds stand for, at its largest device count (the sweep's included)."""
    return this_machine(config.device_type, max([config.devices * config.clients, *(config.sweep_devices or ())]))


def describe_model(definition) -> str:
    labels = int(np.prod(definition.label_shape))  # a language model: one label per token
    per_token = f", {definition.flops_per_example / labels / 1e6:.2f} per token" if labels > 1 else ""
    return (
        f"model: {definition.description or definition.name}; {definition.parameter_count():,} parameters, "
        f"{definition.flops_per_example / 1e6:.2f} MFLOP per example{per_token} (forward + backward)"
    )


def describe_cautions(definition) -> List[str]:
    """What the model will compute differently on a trainer, and why, one line each (shared.model.Caution)."""
    return [
        f"caution ({', '.join(caution.trainers) or 'every trainer'}): {caution.text}" for caution in definition.cautions
    ]
