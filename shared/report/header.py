"""The run's facts, printed once before anything trains: devices, batches, optimizer, data and model."""

from typing import Dict, List, Sequence

import numpy as np
import tensorflow as tf

from dtensor_vs_mirrored.shared.console import fit_width
from dtensor_vs_mirrored.shared.devices import keras_version
from dtensor_vs_mirrored.shared.measure.machine import Machine, this_machine
from dtensor_vs_mirrored.shared.measure.memory import can_reset_peak
from dtensor_vs_mirrored.shared.model.registry import definition_for
from dtensor_vs_mirrored.shared.report.layouts import describe_layouts
from dtensor_vs_mirrored.shared.training.keras_fit import describe_compile
from dtensor_vs_mirrored.shared.training.protocol import RunFacts
from dtensor_vs_mirrored.shared.training.registry import cautions_for


def header(config, devices: Sequence[str], data, facts: Dict[str, RunFacts], processes: str = "") -> str:
    """The run's facts, once: devices, what each trainer that runs adds (its mesh, its per-replica batch;
    `facts`: shared.training.registry.describe_runs), and where they train (`processes`, when not all here)."""
    devices_notes = "".join(f"; {fact.devices}" for fact in facts.values() if fact.devices)
    per_replica = [fact.per_replica_batch for fact in facts.values() if fact.per_replica_batch]
    keras = keras_version()
    return "\n".join(
        fit_width(line, indent=2)
        for line in [
            f"TensorFlow {tf.__version__}" + (f", Keras {keras}" if keras else "") + f"; {len(devices)} logical "
            f"{config.device_type} devices "
            f"({devices[0]} .. {devices[-1]})"
            + (f" per client x {config.clients} clients" if config.clients > 1 else "")
            + devices_notes,
            f"global batch {config.batch_size}"
            + (f", per replica {' / '.join(per_replica)}" if per_replica else "")
            + f"; {config.epochs} epoch{'s' * (config.epochs != 1)}",
            describe_training(config),
            data.describe(),
            describe_model(definition_for(config)),
        ]
        + describe_layouts(config)
        + describe_objective(definition_for(config), config)
        + describe_cautions(cautions_for(config, len(data.y_train)))
        + ([processes] if processes else [])
        + [describe_peak(config.device_type)]
        + [run_machine(config).describe()]
    )


def describe_peak(device_type: str) -> str:
    """The line on what the results' "peak MB" is (shared/run/results.py measures it)."""
    if device_type == "GPU":
        return "memory: peak MB is TensorFlow's peak allocation on each trainer's devices while it trained"
    if can_reset_peak():
        return (
            "memory: peak MB is each trainer's own: how far its process's RSS rose above where it stood when the "
            "trainer started"
        )
    return (
        "memory: peak MB is its process's peak RSS so far (this system cannot reset it): a trainer's includes "
        "those trained before it in its process"
    )


def describe_training(config) -> str:
    """The optimizer and the run's dtype and seed (and --shuffle's order); with --fit, model.fit and the model's
    compile settings."""
    order = "; the training set reshuffled every epoch from the seed (--shuffle)" if config.shuffle else ""
    if config.fit:
        return (
            f"Keras model.fit (--fit): the reference on one device, mirrored under MirroredStrategy; "
            f"{describe_compile(definition_for(config), config)}; {config.dtype}; seed {config.seed}{order}"
        )
    clipping = (
        f", gradients clipped to global norm {config.clip_global_norm:g} after they are combined"
        if config.clip_global_norm
        else ""
    )
    choice = definition_for(config).optimizer  # a compiled Keras Adam or SGD trains instead of --optimizer
    name = choice.name if choice else config.optimizer
    adam = f" ({config.adam} Adam)" if name == "adam" else ""
    rate = f"the model's compiled {choice.description}" if choice else f"lr {config.learning_rate:g}"
    dtype = describe_dtype(config)
    return f"{name} {rate}{adam}{clipping}; {dtype}; seed {config.seed}{order}"


def describe_dtype(config) -> str:
    """The run's dtype; a mixed policy's compute dtype, and on CPUs that its kernels there are not a GPU's."""
    if config.compute_dtype == config.weight_dtype:
        return config.dtype
    loss_scaling = ", dynamic loss scaling" if config.dtype == "mixed_float16" else ""
    where = (
        f"; on CPUs {config.compute_dtype} kernels are not a GPU's: its speeds do not carry over"
        if config.device_type == "CPU"
        else ""
    )
    return f"{config.dtype} ({config.compute_dtype} compute, float32 weights and loss{loss_scaling}{where})"


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


def describe_objective(definition, config) -> List[str]:
    """What the trainers train against, where the model says more than the default loss (a compiled Keras model's
    loss, its own losses, its optimizer set aside); --fit's line says it already."""
    return [] if config.fit or not definition.objective else [f"objective: {definition.objective}"]


def describe_cautions(cautions) -> List[str]:
    """What the model will compute differently on a trainer, and why, one line each (shared.model.Caution)."""
    return [f"caution ({', '.join(caution.trainers) or 'every trainer'}): {caution.text}" for caution in cautions]
