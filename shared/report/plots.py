"""The comparison's plots: the tutorial's loss and accuracy curves, the per-step loss
difference from the reference, throughput (against device count when sweeping), and with
--profile each configuration's step parts, stacked.

Each PNG is rendered to memory and written atomically.
"""

import io
import os

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import numpy as np
from matplotlib import pyplot as plt
from matplotlib.patches import Patch

from dtensor_vs_mirrored.shared.files import write_atomically
from dtensor_vs_mirrored.shared.measure.history import throughput
from dtensor_vs_mirrored.shared.training.trainer_names import SPEC_MODULES

FIGURE_SIZE = (9, 6)  # the tutorial's rcParams['figure.figsize']
DPI = 100  # 900 x 600 pixels
# Each trainer's colour, in --trainers' order: the reference grey, then matplotlib's first two.
TRAINER_COLOURS = dict(zip(SPEC_MODULES, ("#555555", "#1f77b4", "#ff7f0e")))
OTHER_COLOUR = "#777777"
EXACT_FLOOR = 1e-10  # where a zero loss difference is drawn when no step differs at all


def _save(figure, directory: str, name: str) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    plt.close(figure)
    write_atomically(os.path.join(directory, name), buffer.getvalue())


def _epoch_metric_plot(run, directory: str, metric: str, label: str) -> None:
    figure, axes = plt.subplots(figsize=FIGURE_SIZE)
    # Trainers that agree draw on top of each other: the first is widest, so all stay visible.
    for rank, (name, result) in enumerate(run.results.items()):
        if result.history is None or not result.history.epochs:
            continue
        epochs = [r.epoch for r in result.history.epochs]
        width, marker_size = 6 - 2 * rank, 12 - 4 * rank
        (line,) = axes.plot(
            epochs,
            [getattr(r, f"train_{metric}") for r in result.history.epochs],
            marker="o",
            markersize=marker_size,
            linewidth=width,
            label=f"{name} train",
        )
        axes.plot(
            epochs,
            [getattr(r, f"test_{metric}") for r in result.history.epochs],
            marker="s",
            markersize=marker_size,
            linewidth=width,
            linestyle="--",
            color=line.get_color(),
            label=f"{name} test",
        )
    axes.set_xlabel("epoch")
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.set_ylabel(label)
    axes.set_title(f"{label.capitalize()} per epoch (train: over the epoch's steps; test: after it)")
    axes.legend(title="lines overlap where trainers agree")
    axes.grid(alpha=0.3)
    _save(figure, directory, f"{metric}.png")


def _loss_diffs(history, reference) -> np.ndarray:
    losses, reference_losses = np.asarray(history.step_losses), np.asarray(reference.step_losses)
    steps = min(len(losses), len(reference_losses))
    with np.errstate(invalid="ignore"):
        return np.abs(losses[:steps] - reference_losses[:steps])


def _loss_diff_plot(run, directory: str) -> None:
    """Each trainer's per-step |loss - reference loss| in the run's dtype and, if float32 failed, in the
    float64 rerun; each dtype's tolerance (atol + rtol |reference loss|); each trainer's verdict."""
    figure, axes = plt.subplots(figsize=FIGURE_SIZE)
    series, bounds = _loss_diff_series(run), _loss_bounds(run)
    # Exact agreement would vanish on a log axis; it is drawn on a floor line below everything else.
    positive = [
        values[np.isfinite(values) & (values > 0)]
        for values in [diffs for _, diffs, _, _ in series] + [bound for _, _, bound in bounds]
    ]
    smallest = min((float(p.min()) for p in positive if p.size), default=EXACT_FLOOR * 10)
    floor = 10.0 ** np.floor(np.log10(smallest)) / 10
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for label, diffs, marker, rank in series:
        axes.plot(
            np.arange(len(diffs)),
            np.where(diffs == 0, floor, diffs),
            marker=marker,
            markersize=4,
            linestyle="none",
            color=colours[rank % len(colours)],
            label=label,
        )
    for parity, style, bound in bounds:
        atol, rtol = parity.tolerances["loss"]
        axes.plot(
            np.arange(len(bound)),
            bound,
            color="red",
            linestyle=style,
            label=f"{parity.dtype} tolerance {atol:.0e} + {rtol:.0e} |reference loss|",
        )
    axes.set_yscale("log")
    axes.set_xlabel("training step")
    axes.set_ylabel(f"|loss - reference loss| (log scale; {floor:.0e} = exactly equal)")
    axes.set_title("Per-step training loss difference from the single-device reference")
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3, which="both")
    _save(figure, directory, "loss_diff.png")


def _loss_diff_series(run) -> list:
    """(label, per-step |loss diff|, marker, colour index) of each trainer, and of its float64 rerun if any."""
    series = []
    for rank, (name, parity) in enumerate(run.parity.items()):
        diffs = _loss_diffs(run.results[name].history, run.results["reference"].history)
        series.append((f"{name} {parity.dtype}: {run.verdicts[name].verdict}", diffs, "o", rank))
        if name in run.float64_histories and "reference" in run.float64_histories:
            diffs = _loss_diffs(run.float64_histories[name], run.float64_histories["reference"])
            series.append((f"{name} float64 rerun", diffs, "x", rank))
    return series


def _loss_bounds(run) -> list:
    """(parity, line style, per-step loss bound) of the run's dtype and, if a float64 rerun explained, float64's."""
    tolerances = [(run.results["reference"].history, parity, ":") for parity in list(run.parity.values())[:1]]
    explained = next((v.float64 for v in run.verdicts.values() if v.float64 is not None), None)
    if explained is not None and "reference" in run.float64_histories:
        tolerances.append((run.float64_histories["reference"], explained, "--"))
    return [
        (
            parity,
            style,
            parity.tolerances["loss"][0] + parity.tolerances["loss"][1] * np.abs(np.asarray(reference.step_losses)),
        )
        for reference, parity, style in tolerances
    ]


def _sweep_plot(axes, sweep) -> None:
    """Every configuration's ratio to the reference trained beside it, grouped by device count;
    the fastest DTensor mesh and the faster approach at each count marked."""
    colours = TRAINER_COLOURS
    position, ticks, labels, seen = 0.0, [], [], set()
    for count in dict.fromkeys(entry.devices for entry in sweep):
        for entry in (e for e in sweep if e.devices == count):
            ratio = entry.ratio_to_reference or 0.0  # skipped, failed or below the floor: no bar
            legend = entry.trainer if entry.trainer not in seen else None
            seen.add(entry.trainer)
            axes.bar(
                position,
                ratio,
                color=colours.get(entry.trainer, OTHER_COLOUR),
                label=legend,
                edgecolor="black",
                linewidth=2.5 if entry.faster_approach else 0.5,
                hatch="//" if entry.fastest_mesh else None,
            )
            text = "-" if entry.ratio_to_reference is None else f"{ratio:.2f}x"
            axes.annotate(
                text + (" *" if entry.fastest_mesh else ""),
                (position, ratio),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 2),
                textcoords="offset points",
            )
            ticks.append(position)
            labels.append(
                f"{count} dev\n" + (entry.mesh.replace(",", "\n") if entry.mesh else f"update\n{entry.update}")
            )
            position += 1
        position += 0.8  # a gap between device counts
    axes.axhline(1.0, color="black", linestyle="--", label="reference (1 device) = 1")
    handles, names = axes.get_legend_handles_labels()
    handles += [
        Patch(facecolor="white", edgecolor="black", hatch="//"),
        Patch(facecolor="white", edgecolor="black", linewidth=2.5),
    ]
    axes.legend(handles, names + ["fastest DTensor mesh (*)", "faster approach (thick edge)"], fontsize=8)
    axes.set_xticks(ticks)
    axes.set_xticklabels(labels, fontsize=7)
    axes.set_ylabel("throughput / the reference's, trained just before")
    axes.set_title("Every configuration against device count (fastest epoch after the first)")


def _throughput_plot(run, sweep, directory: str) -> None:
    train_examples = len(run.data.y_train)
    figure, axes = plt.subplots(figsize=FIGURE_SIZE)
    if sweep:
        _sweep_plot(axes, sweep)
    else:
        names, values, errors, colours = [], [], [], []
        for name, result in run.results.items():
            figures = throughput(result.history, train_examples) if result.history is not None else None
            if figures is None:  # failed, or below the timing floor
                continue
            median, low, high = figures
            names.append(f"{name}\n{result.history.placement}")
            colours.append(TRAINER_COLOURS.get(name.split(" ")[0], OTHER_COLOUR))  # the API's keys add a mesh
            values.append(median)
            errors.append((median - low, high - median))
        axes.bar(
            names,
            values,
            yerr=np.array(errors).T if errors else None,
            capsize=6,
            color=colours,
            label="median over epochs 2..",
        )
        axes.set_title("Training throughput (first epoch excluded; bars show min-max)")
        axes.tick_params(axis="x", labelsize=8)
        axes.set_ylabel("training examples per second")
        axes.legend(fontsize=8)
    axes.grid(alpha=0.3, axis="y")
    _save(figure, directory, "throughput.png")


def profiled_bars(run, sweep) -> list:
    """(label, StepProfile) per bar: each profiled trainer of the run, then each profiled sweep configuration."""

    def label(name, history):  # e.g. "8 dev\ndtensor\nbatch=8", "1 dev\nreference"
        details = history.details
        mesh_or_update = details.get("mesh") or (f"update {details['update']}" if "update" in details else "")
        devices = 1 if name == "reference" else run.config.devices
        return f"{devices} dev\n{name}\n" + mesh_or_update.replace(",", "\n").replace(" ", "\n")

    bars = [
        (label(name, result.history), result.history.step_profile)
        for name, result in run.results.items()
        if result.history is not None and result.history.step_profile is not None
    ]
    return bars + [
        (
            f"{entry.devices} dev\n{entry.trainer}\n" + entry.label.replace(",", "\n").replace(" ", "\n"),
            entry.step_profile,
        )
        for entry in sweep
        if entry.step_profile is not None
    ]


def _step_profile_plot(bars, directory: str) -> None:
    """--profile: each configuration's ms per step, its parts stacked."""
    from dtensor_vs_mirrored.shared.measure.profile import PARTS

    figure, axes = plt.subplots(figsize=FIGURE_SIZE)
    bottoms = np.zeros(len(bars))
    colours = {
        "forward": "#1f77b4",
        "backward": "#aec7e8",
        "collectives": "#d62728",
        "update": "#2ca02c",
        "input": "#9467bd",
        "other": "#c7c7c7",
    }
    for part in PARTS:
        heights = np.array([profile.parts_ms[part] for _, profile in bars])
        axes.bar(
            range(len(bars)), heights, bottom=bottoms, color=colours[part], label=part, edgecolor="white", linewidth=0.5
        )
        bottoms += heights
    for position, (_, profile) in enumerate(bars):
        axes.annotate(
            f"{profile.step_ms:.1f}",
            (position, profile.step_ms),
            ha="center",
            va="bottom",
            fontsize=7,
            xytext=(0, 2),
            textcoords="offset points",
        )
    axes.set_xticks(range(len(bars)))
    axes.set_xticklabels([label for label, _ in bars], fontsize=6)
    axes.set_ylabel("ms per step (wall time, split by the ops that ran)")
    axes.set_title("Where a step's time goes (--profile; collectives: time the step waited on them)")
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    _save(figure, directory, "step_profile.png")


def write_all(directory: str, run, sweep) -> None:
    _epoch_metric_plot(run, directory, "loss", "loss (cross-entropy)")
    _epoch_metric_plot(run, directory, "accuracy", "accuracy (fraction correct)")
    if run.results["reference"].history is not None:
        _loss_diff_plot(run, directory)
    _throughput_plot(run, sweep, directory)
    bars = profiled_bars(run, sweep)
    if bars:
        _step_profile_plot(bars, directory)
