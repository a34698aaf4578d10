"""The device sweep's part of what compare.py prints: the plan's line, each configuration's progress line, the
float64 reruns' summary, the table's rows and the notes under it."""

from collections import Counter
from typing import List, Sequence

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.judge import ranking
from dtensor_vs_mirrored.shared.judge.ranking import MIN_RANKED_STEPS, SweepEntry, conclude
from dtensor_vs_mirrored.shared.measure import timing
from dtensor_vs_mirrored.shared.measure.memory import MB

SWEEP_HEADERS = ["dev", "configuration", "ex/s (ref.)", "ratio (spread)", "MB/dev", "MB/step", "parity", "mark"]


def describe_plan(config: Config, points: Sequence) -> str:
    """The header's line: what the sweep adds after the run the other flags describe (`points`: the planned
    shared.run.sweep.SweepPoint)."""
    counts = list(dict.fromkeys(point.devices for point in points))
    skipped = sum(1 for point in points if point.skipped)
    return (
        f"sweep: after this run at {_devices(config.devices)}, {len(points)} configurations at "
        f"{', '.join(map(str, counts[:-1]))}{', ' * (len(counts) > 1)}{_devices(counts[-1])}"
        + (f" ({skipped} skipped)" if skipped else "")
        + ", each judged against this run's reference"
        + (", timed beside it" if timing.wanted(config) else "")
    )


def _devices(count: int) -> str:
    return f"{count} device{'s' * (count != 1)}"


def format_entry_line(entry: SweepEntry) -> str:
    """The progress line printed as each configuration finishes: its figures and its verdict's keyword."""
    prefix = f"sweep      {entry.devices} devices  {entry.trainer:<9}{entry.label:<18} "
    if entry.skipped:
        return f"{prefix}skipped (the reason is under the table)"
    figure = "-" if entry.throughput_examples_per_s is None else f"{entry.throughput_examples_per_s:,.0f}"
    reference = "-" if entry.reference_examples_per_s is None else f"{entry.reference_examples_per_s:,.0f}"
    ratio = "" if entry.ratio_to_reference is None else f" ({ratio_text(entry)})"
    return f"{prefix}{figure} examples/s{ratio}, reference {reference}; parity {entry.verdict}"


def ratio_text(entry: SweepEntry) -> str:
    """ "0.54x", or with its rounds' spread "0.54x, 0.50-0.58"."""
    spread = entry.ratio_spread
    return f"{entry.ratio_to_reference:.2f}x" + (f", {spread[0]:.2f}-{spread[1]:.2f}" if spread else "")


def rerun_summary(entries: Sequence[SweepEntry], devices: int) -> str:
    """One line for the float64 reruns at a device count (each rerun's own lines are not printed); "" if none."""
    reran = [e for e in entries if e.devices == devices and e.float64_rerun_seconds]
    if not reran:
        return ""
    outcomes = Counter(e.verdict for e in reran)
    timed = sum(1 for e in entries if e.devices == devices and not e.skipped)
    return (
        f"sweep      {devices} devices: float32 left its tolerance in {len(reran)} of {timed} configurations; "
        f"float64 reruns {sum(e.float64_rerun_seconds for e in reran):.1f} s: "
        + ", ".join(f"{count} {verdict}" for verdict, count in outcomes.items())
    )


def sweep_notes(entries: Sequence[SweepEntry]) -> List[str]:
    """Under the sweep table, one line per configuration whose verdict has a reason (the JSON has the whole)."""
    return [
        f"{e.devices} devices {e.trainer} {e.label} ({e.verdict}): {e.summary or e.reason}"
        for e in entries
        if e.summary or e.reason
    ]


def best_against_one_device(entries: Sequence[SweepEntry]) -> str:
    """One line when no configuration that matched the reference beat it (ratio above 1); "" otherwise."""
    best = ranking.best_when_none_beat_one_device(list(entries))
    if best is None:
        return ""
    return (
        f"No configuration beat one device on this machine; the best: {best.trainer} {best.label} at "
        f"{best.devices} devices, {best.ratio_to_reference:.2f}x its reference"
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
                f"{figure(e.throughput_examples_per_s)} ({figure(e.reference_examples_per_s)})",
                ("-" if e.ratio_to_reference is None else ratio_cell(e)) + ("?" if e.too_short or e.tied else ""),
                "-" if e.skipped else f"{e.memory_per_device_bytes / MB:,.2f}",
                "-" if e.link_bytes is None else f"{e.link_bytes / MB:,.2f}",
                e.verdict,
                ", ".join(marks),
            ]
        )
    return rows


def ratio_cell(entry: SweepEntry) -> str:
    spread = entry.ratio_spread
    return f"{entry.ratio_to_reference:.2f}x" + (f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread else "")


def conclusion_lines(entries: Sequence[SweepEntry], model: str, device_memory_mb=None) -> List[str]:
    """The sweep's own conclusion for the run's model, one line per device count: the fastest configuration (and
    those it may not be faster than), the one that holds least per device and the one that sends fewest bytes,
    those within --device-memory, what was measured too briefly to rank and what ties."""
    limit = None if device_memory_mb is None else int(device_memory_mb * MB)
    lines = []
    for count, found in conclude(list(entries), limit).items():
        parts = []
        if found.fastest is not None:
            rivals = f", within the spread of {', '.join(map(_named, found.rivals))}" if found.rivals else ""
            parts.append(f"fastest {_named(found.fastest)} ({ratio_text(found.fastest)}{rivals})")
        if found.least_memory is not None:
            parts.append(
                f"least memory {_named(found.least_memory)} ({found.least_memory.memory_per_device_bytes / MB:,.2f} "
                f"MB/device)"
            )
        if found.fewest_bytes is not None:
            parts.append(
                f"fewest bytes {_named(found.fewest_bytes)} ({found.fewest_bytes.link_bytes / MB:,.2f} MB/step)"
            )
        if found.fitting is not None:
            within = ", ".join(_named(e) for e in found.fitting) or "none"
            parts.append(f"within {device_memory_mb:g} MB/device: {within}")
        if parts:
            lines.append(f"{model} at {_devices(count)}: " + "; ".join(parts))
        if found.too_short:
            short = min(e.measured_steps for e in entries if e.devices == count and e.too_short)
            lines.append(
                f"{_devices(count)}: {found.too_short} ratio{'s' * (found.too_short > 1)} marked ? came from "
                f"{short} measured steps, too few to rank; ask for {MIN_RANKED_STEPS} or more (more --epochs "
                f"or --train-examples)"
            )
        if found.tied:
            lines.append(
                f"{_devices(count)}: {len(found.tied)} ratios marked ? have spreads (the min-max of their rounds, each "
                f"beside the reference's) that overlap another's: their order was not measured"
            )
    return lines


def _named(entry: SweepEntry) -> str:
    return f"{entry.trainer} {entry.label}"
