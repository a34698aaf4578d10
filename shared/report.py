"""What compare.py prints and writes: the header, the tables, the JSON report, TensorBoard scalars.

Every file is written atomically (shared/files.py), so a failure never leaves a
half-written report behind.
"""

import dataclasses
import json
import os
from typing import List, Sequence

import numpy as np
import tensorflow as tf
from tabulate import tabulate

from shared import baseline, profile_report
from shared.benchmark import PEAK_MATMUL_SIZE
from shared.console import fit_width
from shared.devices import op_determinism_enabled
from shared.digest import data_sha256, digests
from shared.errors import UsageError
from shared.export import LOGIT_TOLERANCE
from shared.files import check_writable_dir, write_atomically
from shared.history import MIN_MEASURED_SECONDS, step_time_percentiles_ms, throughput
from shared.memory import MB, largest_total_bytes
from shared.models import definition_for
from shared.parity_report import (
    PARITY_HEADERS,
    float64_rerun_dict,
    last_line,
    parity_dict,
    parity_notes,
    parity_rows,
    parity_title,
)
from shared.report_schema import SCHEMA_VERSION
from shared.reproducibility import reproducibility_dict
from shared.sweep import best_against_one_device, sweep_notes

RESULT_HEADERS = [
    "trainer",
    "devices / mesh",
    "collectives",
    "train loss",
    "train acc",
    "test loss",
    "test acc",
    "examples/s (spread)",
    "step p50 ms",
    "step p95 ms",
    "trace s",
    "memory/device MB",
    "peak MB",
]
# One table of all twelve is ~180 columns: printed as two, "Results" and "Speed and memory", each
# within shared.console.LINE_WIDTH; the trainer's name leads both.
RESULT_COLUMNS = 7  # trainer, devices / mesh, collectives, losses and accuracies; the rest are speed and memory
SWEEP_HEADERS = ["devices", "configuration", "examples/s", "reference", "ratio", "MB/device", "parity", "fastest"]
BELOW_FLOOR = (
    f"-: no epoch after the first ran {MIN_MEASURED_SECONDS:g} s or more without tracing (the timing "
    f"floor, shared/history.py);\n   use more --epochs or --train-examples"
)


def check_outputs(config) -> None:
    """Reject unwritable output paths before any training starts."""
    if config.json:
        if os.path.isdir(config.json):
            raise UsageError(f"--json {config.json} is a directory; give a file path such as {config.json}/report.json")
        check_writable_dir("--json", os.path.dirname(os.path.abspath(config.json)), create=False)
    for flag, directory in (("--plots", config.plots), ("--logdir", config.logdir)):
        if directory:
            check_writable_dir(flag, directory, create=True)


def header(config, devices: Sequence[str], data, facts: dict) -> str:
    """The run's facts, once: devices, and the mesh and per-replica batch only of the trainers that run
    (`facts`: shared.trainers.describe_runs)."""
    per_replica, mesh = [], ""
    if "dtensor" in facts:
        mesh = f"; DTensor mesh {facts['dtensor']['mesh']}"
        per_replica.append(f"{facts['dtensor']['per_replica_batch']} (DTensor)")
    if "mirrored" in facts:
        per_replica.append(f"{facts['mirrored']['per_replica_batch']} (MirroredStrategy)")
    return "\n".join(
        fit_width(line, indent=2)
        for line in [
            f"TensorFlow {tf.__version__}; {len(devices)} logical {config.device_type} devices "
            f"({devices[0]} .. {devices[-1]})"
            + (f" per client x {config.clients} clients" if config.clients > 1 else "")
            + mesh,
            f"global batch {config.batch_size}"
            + (f", per replica {' / '.join(per_replica)}" if per_replica else "")
            + f"; {config.epochs} epoch{'s' * (config.epochs != 1)}",
            f"{config.optimizer} lr {config.learning_rate:g}"
            + (f" ({config.adam} Adam)" if config.optimizer == "adam" else "")
            + f"; {config.dtype}; seed {config.seed}",
            data.describe(),
            describe_model(definition_for(config)),
        ]
    )


def describe_model(definition) -> str:
    return (
        f"model: {definition.description or definition.name}; {definition.parameter_count():,} parameters, "
        f"{definition.flops_per_example / 1e6:.2f} MFLOP per example (forward + backward)"
    )


def result_rows(run) -> List[list]:
    rows = []
    train_examples = len(run.data.y_train)
    for name, result in run.results.items():
        history = result.history
        if history is None:
            rows.append([name, "-", "-", "-", "-", "-", "-", "FAILED", "-", "-", "-", "-", "-"])  # why: under parity
            continue
        last = history.epochs[-1] if history.epochs else None
        figures = throughput(history, train_examples)
        percentiles = step_time_percentiles_ms(history)
        rows.append(
            [
                name,
                history.placement,
                history.collectives.name if history.collectives else "-",
                *(
                    f"{v:.4f}"
                    for v in (
                        (last.train_loss, last.train_accuracy, last.test_loss, last.test_accuracy)
                        if last
                        else (float("nan"),) * 4
                    )
                ),
                "-" if figures is None else f"{figures[0]:,.0f} ({figures[1]:,.0f}-{figures[2]:,.0f})",
                *(("-", "-") if percentiles is None else (f"{percentiles[0]:.2f}", f"{percentiles[1]:.2f}")),
                f"{history.trace_seconds:.2f}",
                f"{largest_total_bytes(history.memory_per_device) / MB:,.2f}",
                f"{result.peak_memory_mb:,.0f}",
            ]
        )
    return rows


def model_facts(definition) -> dict:
    """What the report says of the model: its name, variables and their DTensor layouts on a model axis."""
    return {
        "name": definition.name,
        "description": definition.description,
        "parameters": definition.parameter_count(),
        "flops_per_example": definition.flops_per_example,
        "variables": [
            {"name": variable.name, "shape": list(definition.shape(variable)), "layout": list(variable.layout)}
            for variable in definition.variables
        ],
    }


def compute_facts(run) -> dict:
    """FLOPs per example, the measured matmul peak, and each trainer's achieved GFLOP/s (shared/benchmark.py)."""
    flops = definition_for(run.config).flops_per_example
    train_examples = len(run.data.y_train)
    achieved = {}
    for name, result in run.results.items():
        figures = throughput(result.history, train_examples) if result.history is not None else None
        if result.history is not None:
            achieved[name] = None if figures is None else figures[0] * flops / 1e9  # None: below the floor
    return {
        "flops_per_example": flops,
        "matmul_peak_gflops": run.matmul_peak_gflops,
        "matmul_peak_dtype": run.config.dtype,
        "achieved_gflops": achieved,
    }


def passed(run, sweep) -> bool:
    """The verdict: every trainer finished and matched the reference, in the main run and the sweep."""
    return bool(run.ok and all(entry.ok for entry in sweep))


def exit_ok(run, sweep) -> bool:
    """Exit 0: parity holds, and no trainer CHANGED against --baseline."""
    return passed(run, sweep) and (run.baseline is None or run.baseline.ok)


def collectives_line(run) -> str:
    """Under the results: which collective implementation each trainer ran, and why that one."""
    return "collectives: " + "; ".join(
        f"{name} {result.history.collectives.describe()}"
        for name, result in run.results.items()
        if result.history is not None and result.history.collectives is not None
    )


def sweep_collectives_line(sweep) -> str:
    """Under the sweep table (no column is left within 120): each trainer's rows' collective implementation."""
    seen = {}
    for entry in sweep:
        if entry.collectives is not None:
            seen.setdefault(entry.trainer, set()).add(entry.collectives.describe())
    return (
        "collectives: " + "; ".join(f"{trainer} rows {', '.join(sorted(names))}" for trainer, names in seen.items())
        if seen
        else ""
    )


def print_profile(run, link_gbps, out=None) -> None:
    """--profile: each trainer's step parts, and under them its bytes per step."""
    histories = [(name, result.history) for name, result in run.results.items()]
    rows = profile_report.trainer_rows(histories)
    if rows:
        print(f"\n{profile_report.TITLE}", file=out)
        print(tabulate(rows, ["trainer", *profile_report.PART_HEADERS], tablefmt="github"), file=out)
        for line in profile_report.traffic_lines(
            [(name, history.traffic, history.traffic_missing) for name, history in histories if history is not None],
            link_gbps,
        ):
            print(fit_width(line, indent=2), file=out)


def print_sweep_profile(sweep, link_gbps, out=None) -> None:
    """--profile with --sweep-devices: the same for every configuration of the sweep."""
    rows = profile_report.sweep_rows(sweep)
    if rows:
        print(
            "\nStep profile of every sweep configuration, ms per step (each reference's: the step profile above)",
            file=out,
        )
        print(tabulate(rows, ["devices", "configuration", *profile_report.PART_HEADERS], tablefmt="github"), file=out)
        for line in profile_report.traffic_lines(
            [(f"{e.devices} devices {e.trainer} {e.label}", e.traffic, e.traffic_missing) for e in sweep], link_gbps
        ):
            print(fit_width(line, indent=2), file=out)


def print_tables(run, sweep, out=None) -> None:
    if run.parity or any(r.failed for r in run.results.values()):
        print(f"\n{parity_title(run)}", file=out)
        print(tabulate(parity_rows(run), PARITY_HEADERS, tablefmt="github"), file=out)
        for note in parity_notes(run):
            print(fit_width(note), file=out)
    rows = result_rows(run)
    print("\nResults after the last epoch", file=out)
    print(
        tabulate([row[:RESULT_COLUMNS] for row in rows], RESULT_HEADERS[:RESULT_COLUMNS], tablefmt="github"), file=out
    )
    print(fit_width(collectives_line(run), indent=2), file=out)
    print(
        "\nSpeed and memory (throughput and step times from the epochs after the first, which traces;\n"
        "memory/device: weights + optimizer state on the busiest device; peak MB on CPU: the process's peak RSS "
        "so far)",
        file=out,
    )
    print(
        tabulate(
            [row[:1] + row[RESULT_COLUMNS:] for row in rows],
            RESULT_HEADERS[:1] + RESULT_HEADERS[RESULT_COLUMNS:],
            tablefmt="github",
        ),
        file=out,
    )
    compute = compute_facts(run)
    below_floor = any(row[RESULT_COLUMNS] == "-" for row in rows) or None in compute["achieved_gflops"].values()
    if compute["matmul_peak_gflops"]:
        achieved = ", ".join(
            f"{name} -" if gflops is None else f"{name} {gflops:.0f} ({gflops / compute['matmul_peak_gflops']:.0%})"
            for name, gflops in compute["achieved_gflops"].items()
        )
        print(
            fit_width(
                f"\nGFLOP/s: {achieved} of this run's {compute['matmul_peak_dtype']} matmul peak, "
                f"{compute['matmul_peak_gflops']:.0f} GFLOP/s\n({compute['flops_per_example'] / 1e6:.2f} "
                f"MFLOP per example, forward + backward; the peak: a {PEAK_MATMUL_SIZE}x{PEAK_MATMUL_SIZE} "
                f"{compute['matmul_peak_dtype']} matmul on one device)",
                indent=2,
            ),
            file=out,
        )
    if below_floor:
        print(BELOW_FLOOR, file=out)
    for line in export_lines(run):
        print(fit_width(line), file=out)
    print_profile(run, run.config.link_gbps, out)
    if sweep:
        print("\nThroughput against device count: every configuration, each beside its own reference", file=out)
        print(tabulate(sweep_rows(sweep), SWEEP_HEADERS, tablefmt="github"), file=out)
        print(
            "(examples/s: each one's fastest epoch after the first; reference: the same of the reference trained "
            "just before it;\nratio: the two's; MB/device: weights + optimizer state on the busiest device; "
            "fastest at that count, by ratio:\nM the DTensor mesh, A the approach)",
            file=out,
        )
        for line in [sweep_collectives_line(sweep)] + sweep_notes(sweep) + [best_against_one_device(sweep)]:
            if line:
                print(fit_width(line, indent=2), file=out)
        if not below_floor and any(e.throughput_examples_per_s is None and not e.skipped for e in sweep):
            print(BELOW_FLOOR, file=out)
        print_sweep_profile(sweep, run.config.link_gbps, out)
    print_repeats_and_baseline(run, out)
    print(f"\n{last_line(run, passed(run, sweep))}", file=out)
    if run.baseline is not None:
        print(baseline.last_line(run.baseline), file=out)


def print_repeats_and_baseline(run, out=None) -> None:
    """--repeat's table (shared/reproducibility.py) and --baseline's (shared/baseline.py)."""
    if run.reproducibility:
        print(
            fit_width(
                f"\nReproducibility: each trainer trained {run.config.repeat} times from the same start in "
                f"this process, compared bit for bit (op determinism "
                f"{'on' if op_determinism_enabled() else 'off'}: --deterministic)"
            ),
            file=out,
        )
        print(
            tabulate(
                [[name, found.runs, found.line()] for name, found in run.reproducibility.items()],
                ["trainer", "runs", "result"],
                tablefmt="github",
            ),
            file=out,
        )
    if run.baseline is not None:
        print(fit_width(f"\n{baseline.title(run.baseline)}"), file=out)
        print(tabulate(baseline.rows(run.baseline), baseline.BASELINE_HEADERS, tablefmt="github"), file=out)


def export_lines(run) -> List[str]:
    """--export: where each trainer's SavedModel went, and how close it serves the trainer's own logits."""
    lines = []
    for name, result in run.results.items():
        details = result.history.details if result.history is not None else {}
        if "export" in details:
            lines.append(
                f"{name:<10} exported {details['export']}: max |logit diff| "
                f"{details['export_max_abs_logit_diff']} from the trainer's own (tolerance {LOGIT_TOLERANCE:g})"
            )
    return ([""] + lines) if lines else []


def sweep_rows(sweep) -> List[list]:
    def figure(value, text="{:,.0f}"):
        return "-" if value is None else text.format(value)

    rows = []
    for e in sweep:
        marks = [mark for mark, on in (("M", e.fastest_mesh), ("A", e.faster_approach)) if on]
        rows.append(
            [
                e.devices,
                f"{e.trainer} {e.label}",
                figure(e.throughput_examples_per_s),
                figure(e.reference_examples_per_s),
                figure(e.ratio_to_reference, "{:.2f}x"),
                "-" if e.skipped else f"{e.memory_per_device_bytes / MB:,.2f}",
                e.verdict,
                ", ".join(marks),
            ]
        )
    return rows


def report_dict(run, sweep) -> dict:
    link_gbps = run.config.link_gbps
    train_examples = len(run.data.y_train)
    trainers = {}
    for name, result in run.results.items():
        history = result.history
        if history is None:
            trainers[name] = {"failed": True, "error": result.error, "traceback": result.traceback}
            continue
        median, low, high = throughput(history, train_examples) or (None, None, None)  # None: below the floor
        p50, p95 = step_time_percentiles_ms(history) or (None, None)
        trainers[name] = {
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
            "memory_per_device": [dataclasses.asdict(record) for record in history.memory_per_device],
            "details": history.details,
            "final_weights": digests(history),  # shared/digest.py: what --baseline compares
            "collectives": profile_report.implementation_dict(history.collectives),
            "step_profile": profile_report.profile_dict(history.step_profile),  # --profile
            "traffic": profile_report.traffic_dict(history.traffic, link_gbps),
            "traffic_missing": history.traffic_missing,
        }
    config = dataclasses.asdict(run.config)
    return {
        "schema_version": SCHEMA_VERSION,  # shared/report.schema.json; docs/report-changelog.md
        "ok": exit_ok(run, sweep),  # compare.py's exit code was 0
        "config": config,
        "environment": {
            "tensorflow": tf.__version__,
            "data_source": run.data.source,
            "data_reason": run.data.reason,
            "data_fallback": run.data.fallback or None,
            "devices": run.devices,
            "train_examples": train_examples,
            "test_examples": len(run.data.y_test),
            "data_sha256": data_sha256(run.data),
            "op_determinism": op_determinism_enabled(),
        },
        "trainers": trainers,
        "parity": parity_dict(run),
        "float64_rerun": float64_rerun_dict(run),
        "reproducibility": reproducibility_dict(run, op_determinism_enabled()),
        "baseline": baseline.baseline_dict(run.baseline),
        "model": model_facts(definition_for(run.config)),
        "compute": compute_facts(run),
        **(
            {
                "sweep": [
                    {**dataclasses.asdict(entry), "traffic": profile_report.traffic_dict(entry.traffic, link_gbps)}
                    for entry in sweep
                ]
            }
            if sweep
            else {}
        ),
    }


def _finite(value):
    """NaN and infinity are not JSON: they become null (a diverged loss, say)."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def write_tensorboard(logdir: str, run) -> None:
    """Scalars per trainer: the loss of every step and the per-epoch metrics."""
    for name, result in run.results.items():
        if result.history is None:
            continue
        writer = tf.summary.create_file_writer(os.path.join(logdir, name))
        with writer.as_default():
            for step, loss in enumerate(result.history.step_losses):
                tf.summary.scalar("step_loss", loss, step=step)
            for record in result.history.epochs:
                for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
                    tf.summary.scalar(key, getattr(record, key), step=record.epoch)
        writer.close()


def publish(config, run, sweep=()) -> int:
    """Print the tables, write --json, --plots and --logdir; return compare.py's exit code (0: parity holds)."""
    print_tables(run, sweep)
    write_outputs(config, run, sweep)
    return 0 if exit_ok(run, sweep) else 1


def write_outputs(config, run, sweep) -> None:
    if config.json:
        payload = json.dumps(_finite(report_dict(run, sweep)), indent=2, allow_nan=False).encode()
        write_atomically(config.json, payload)
    if config.plots:
        from shared import plots

        plots.write_all(config.plots, run, sweep)
    if config.logdir:
        write_tensorboard(config.logdir, run)
