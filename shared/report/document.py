"""The JSON report (--json): every figure of the run, each verdict with its whole reason, and the schema version
that shared/report/report.schema.json describes (docs/report-changelog.md)."""

import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

from dtensor_vs_mirrored.shared.devices import keras_version, op_determinism_enabled
from dtensor_vs_mirrored.shared.judge.digest import data_sha256, digests
from dtensor_vs_mirrored.shared.judge.verdict import exit_ok
from dtensor_vs_mirrored.shared.measure.history import step_time_percentiles_ms, throughput
from dtensor_vs_mirrored.shared.measure.peak import yardstick
from dtensor_vs_mirrored.shared.model.registry import definition_for
from dtensor_vs_mirrored.shared.report import profile as profile_report
from dtensor_vs_mirrored.shared.report.baseline import baseline_dict
from dtensor_vs_mirrored.shared.report.header import run_machine
from dtensor_vs_mirrored.shared.report.layouts import layouts_dict
from dtensor_vs_mirrored.shared.report.parity import float64_rerun_dict, parity_dict
from dtensor_vs_mirrored.shared.report.schema import SCHEMA_VERSION
from dtensor_vs_mirrored.shared.training.registry import cautions_for, with_trainers


def model_facts(definition, cautions=None) -> dict:
    """What the report says of the model: its name, variables and their DTensor layouts on a model axis, and the
    run's cautions (default: the model's own; --fit: model.fit's)."""
    cautions = definition.cautions if cautions is None else cautions
    return {
        "name": definition.name,
        "description": definition.description,
        "parameters": definition.parameter_count(),
        "flops_per_example": definition.flops_per_example,
        "input_shape": list(definition.input_shape),
        "input_dtype": definition.input_dtype,
        "label_shape": list(definition.label_shape),
        "classes": definition.classes,
        "targets": definition.targets,
        "loss": definition.loss_name,
        "objective": definition.objective,
        "variables": [
            {"name": variable.name, "shape": list(definition.shape(variable)), "layout": list(variable.layout)}
            for variable in definition.variables
        ],
        "cautions": [{"trainers": list(caution.trainers), "text": caution.text} for caution in cautions],
    }


def compute_facts(run) -> dict:
    """FLOPs per example, the measured matmul rate, each trainer's achieved GFLOP/s and the yardstick of the
    percentages: the fastest of them (shared/measure/peak.py)."""
    flops = definition_for(run.config).flops_per_example
    train_examples = len(run.data.y_train)
    achieved = {}
    for name, result in run.results.items():
        figures = throughput(result.history, train_examples) if result.history is not None else None
        if result.history is not None:
            achieved[name] = None if figures is None else figures[0] * flops / 1e9  # None: below the floor
    measured = yardstick(run.matmul_peak_gflops, achieved) if run.matmul_peak_gflops else (None, None)
    return {
        "flops_per_example": flops,
        "matmul_peak_gflops": run.matmul_peak_gflops,
        "matmul_peak_dtype": run.config.compute_dtype,
        "achieved_gflops": achieved,
        "yardstick_gflops": measured[0],
        "yardstick": measured[1],
    }


def report_dict(run, sweep) -> dict:
    link_gbps = run.config.link_gbps
    trainers = {name: trainer_dict(result, len(run.data.y_train), link_gbps) for name, result in run.results.items()}
    sweep_entries = [
        {**dataclasses.asdict(entry), "traffic": profile_report.traffic_dict(entry.traffic, link_gbps)}
        for entry in sweep
    ]
    return {
        "schema_version": SCHEMA_VERSION,  # shared/report/report.schema.json; docs/report-changelog.md
        "ok": exit_ok(run, sweep),  # compare.py's exit code was 0
        "config": dataclasses.asdict(with_trainers(run.config)),  # the trainers it ran, named
        "environment": {
            "tensorflow": tf.__version__,
            "keras": keras_version(),
            "data_source": run.data.source,
            "data_reason": run.data.reason,
            "data_fallback": run.data.fallback or None,
            "devices": run.devices,
            "train_examples": len(run.data.y_train),
            "test_examples": len(run.data.y_test),
            "data_sha256": data_sha256(run.data),
            "op_determinism": op_determinism_enabled(),
            "machine": machine_dict(run_machine(run.config)),
        },
        "trainers": trainers,
        "parity": parity_dict(run),
        "float64_rerun": float64_rerun_dict(run),
        "reproducibility": reproducibility_dict(run, op_determinism_enabled()),
        "baseline": baseline_dict(run.baseline),
        "model": {
            **model_facts(definition_for(run.config), cautions_for(run.config, len(run.data.y_train))),
            "layouts": layouts_dict(run.config),  # a Keras model's LayoutMap on the run's mesh; None without one
        },
        "compute": compute_facts(run),
        **({"sweep": sweep_entries} if sweep else {}),
    }


def machine_dict(machine) -> dict:
    """What the speed figures stand for (shared/measure/machine.py), with the header's line."""
    return {**dataclasses.asdict(machine), "speeds_transfer": machine.speeds_transfer, "line": machine.describe()}


def trainer_dict(result, train_examples: int, link_gbps) -> dict:
    """One trainer's entry: its failure, or every figure its history holds."""
    history = result.history
    if history is None:
        return {"failed": True, "error": result.error, "traceback": result.traceback}
    median, low, high = throughput(history, train_examples) or (None, None, None)  # None: below the floor
    p50, p95 = step_time_percentiles_ms(history) or (None, None)
    return {
        "failed": False,
        "placement": history.placement,
        "step_losses": [float(v) for v in history.step_losses],
        "epochs": [dataclasses.asdict(record) for record in history.epochs],
        "throughput_examples_per_s": median,
        "throughput_spread_examples_per_s": None if low is None else [low, high],
        "step_time_ms_p50": p50,
        "step_time_ms_p95": p95,
        "trace_seconds": history.trace_seconds,
        "peak_memory_mb": result.peak_memory_mb,
        "peak_memory_rise_mb": result.peak_memory_rise_mb,
        "memory_per_device": [dataclasses.asdict(record) for record in history.memory_per_device],
        "details": history.details,
        "skipped_steps": history.skipped_steps,  # mixed_float16's loss scaling; None in other dtypes
        "final_weights": digests(history),  # shared/judge/digest.py: what --baseline compares
        "collectives": profile_report.implementation_dict(history.collectives),
        "step_profile": profile_report.profile_dict(history.step_profile),  # --profile
        "traffic": profile_report.traffic_dict(history.traffic, link_gbps),
        "traffic_missing": history.traffic_missing,
        "timing": timing_dict(history.timing),
    }


def timing_dict(timing) -> Optional[dict]:
    """The rounds its steady call was timed in after training (shared/run/timing.py); null when it was not (float64,
    --clients, the Python API): its speed figures are then its measured epochs'."""
    if timing is None:
        return None
    ratio = timing.ratio()
    return {
        "steps": timing.steps,
        "rounds": [dataclasses.asdict(timed) for timed in timing.rounds],
        "beside": [dataclasses.asdict(timed) for timed in timing.beside],
        "ratio_to_reference": None if ratio is None else list(ratio),
    }


def reproducibility_dict(run, op_determinism: bool) -> Optional[dict]:
    """JSON `reproducibility`: per trainer, how its repeats compare with its first run; null without --repeat.
    `op_determinism`: whether it was on in the process (--deterministic or TF_DETERMINISTIC_OPS=1)."""
    if not run.reproducibility:
        return None
    return {
        "runs": run.config.repeat,
        "deterministic": op_determinism,
        "trainers": {
            name: {**dataclasses.asdict(found), "line": found.line()} for name, found in run.reproducibility.items()
        },
    }


def finite(value):
    """NaN and infinity are not JSON: they become null (a diverged loss, say)."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value
