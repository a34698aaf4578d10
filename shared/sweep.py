"""The device sweep: which approach, and which DTensor layout, trains fastest at each device count.

    python compare.py --sweep-devices 2,8 --data embedded                      # every layout
    python compare.py --sweep-devices 2,8 --data embedded --sweep-meshes batch  # batch=N only

At each count every trainer offers its configurations (DTensor each mesh, MirroredStrategy each
update mode; shared/trainers.py); one that cannot run is skipped with the trainer's reason. Each
trains beside a reference trained just before it, and its ratio is to that reference (the
machine's speed drifts within minutes); parity is judged for each. The fastest DTensor mesh and
the faster approach are marked by ratio. Measurements and costs: docs/throughput.md.
"""

import dataclasses
from collections import Counter
from typing import List, Optional, Sequence

from shared.config import Config
from shared.errors import UsageError
from shared.history import throughput
from shared.memory import largest_total_bytes
from shared.trainers import trainer_module

SKIPPED, FAILED = "skipped", "FAILED"  # a sweep entry's verdict besides shared/verdict.py's


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One configuration to train: a trainer, at a device count, on a mesh or in an update mode."""

    devices: int
    trainer: str  # "dtensor" or "mirrored"
    config: Config  # the run's, with this count, mesh or update; the reference trains beside it
    mesh: str = ""  # DTensor's, e.g. "batch=4,model=2"
    update: str = ""  # MirroredStrategy's: "primary" or "replicas"
    skipped: str = ""  # why it cannot run (the trainer's check, one line); "" when it can

    @property
    def label(self) -> str:
        return self.mesh or f"update {self.update}"


@dataclasses.dataclass
class SweepEntry:
    devices: int
    trainer: str
    mesh: str  # DTensor's mesh; "" for MirroredStrategy
    update: str  # MirroredStrategy's update mode; "" for DTensor
    throughput_examples_per_s: Optional[float]  # the fastest measured epoch; None: below the timing floor
    reference_examples_per_s: Optional[float]  # the reference trained just before this configuration
    ratio_to_reference: Optional[float]  # None when either figure is None
    parity_ok: bool  # its verdict is ok or float noise (shared/verdict.py)
    # ok, float noise, MISMATCH or diverged (shared/verdict.py); FAILED when it or its reference raised;
    # skipped when it could not run. `reason` says why (the whole of it), `summary` as printed under the table.
    verdict: str = ""
    reason: str = ""
    summary: str = ""
    float64_rerun_seconds: float = 0.0  # its float32 parity failed and the float64 rerun took this long
    memory_per_device_bytes: int = 0  # the busiest device's weights + optimizer state
    error: str = ""  # the trainer (or its reference) raised: one line
    skipped: str = ""  # why this configuration did not run
    fastest_mesh: bool = False  # the DTensor mesh with the best ratio at this device count
    faster_approach: bool = False  # the better ratio of DTensor's fastest mesh and MirroredStrategy's best update
    collectives: Optional[object] = None  # shared.traffic.Implementation its collectives ran with
    # --profile: shared.profile.StepProfile, shared.traffic.Traffic (bytes per step), or why it has none
    step_profile: Optional[object] = None
    traffic: Optional[object] = None
    traffic_missing: str = ""

    @property
    def ok(self) -> bool:
        """For the run's verdict: it matched the reference, or it could not run (and says why)."""
        return self.parity_ok or bool(self.skipped)

    @property
    def label(self) -> str:
        return self.mesh or f"update {self.update}"


def describe_plan(config: Config, points: Sequence[SweepPoint]) -> str:
    """The header's line: what the sweep adds after the run the other flags describe."""
    counts = list(dict.fromkeys(point.devices for point in points))
    skipped = sum(1 for point in points if point.skipped)
    return (
        f"sweep: after this run at {_devices(config.devices)}, {len(points)} configurations at "
        f"{', '.join(map(str, counts[:-1]))}{', ' * (len(counts) > 1)}{_devices(counts[-1])}"
        + (f" ({skipped} skipped)" if skipped else "")
        + ", each beside its own reference run"
    )


def _devices(count: int) -> str:
    return f"{count} device{'s' * (count != 1)}"


def _skip_reason(module, config: Config, devices: Sequence[str]) -> str:
    try:
        module.check_config(config, devices)
    except UsageError as error:
        return str(error)
    return ""


def plan_sweep(config: Config, all_devices: Sequence[str]) -> List[SweepPoint]:
    """Every configuration to train, count by count: DTensor's meshes, then MirroredStrategy's updates."""
    # The main run's outputs, checkpoints and repeats are not the configurations'.
    base = config.replace(
        quiet=True,
        checkpoint_dir=None,
        export=None,
        repeat=1,
        sweep_devices=None,
        json=None,
        plots=None,
        logdir=None,
        baseline=None,
        with_float64=False,
    )
    points = []
    for count in config.sweep_devices or ():
        devices = all_devices[:count]
        for name in ("dtensor", "mirrored"):
            if name not in config.trainers:
                continue
            module = trainer_module(name)
            for label, point_config in module.sweep_configs(
                base.replace(trainers=(name,)), count, config.sweep_meshes == "all"
            ):
                points.append(
                    SweepPoint(count, name, point_config, **label, skipped=_skip_reason(module, point_config, devices))
                )
    return points


def sweep_entry(point: SweepPoint, run, train_examples: int) -> SweepEntry:
    """The entry for `point` from its RunResult (the reference and the point's trainer); run None: skipped."""
    entry = SweepEntry(
        point.devices, point.trainer, point.mesh, point.update, None, None, None, False, skipped=point.skipped
    )
    if run is None:
        entry.verdict, entry.reason = SKIPPED, point.skipped
        return entry
    reference, result = run.results["reference"], run.results[point.trainer]
    entry.error = result.error or (f"reference: {reference.error}" if reference.failed else "")
    if not reference.failed:
        entry.reference_examples_per_s = _fastest(throughput(reference.history, train_examples))
    if not result.failed:
        entry.throughput_examples_per_s = _fastest(throughput(result.history, train_examples))
        entry.memory_per_device_bytes = largest_total_bytes(result.history.memory_per_device)
        entry.collectives, entry.step_profile = result.history.collectives, result.history.step_profile
        entry.traffic, entry.traffic_missing = result.history.traffic, result.history.traffic_missing
    if entry.throughput_examples_per_s is not None and entry.reference_examples_per_s:
        entry.ratio_to_reference = entry.throughput_examples_per_s / entry.reference_examples_per_s
    verdict = run.verdicts.get(point.trainer)
    entry.parity_ok = bool(verdict is not None and verdict.ok) and not run.results["reference"].failed
    if entry.error:
        entry.verdict, entry.reason = FAILED, entry.error
    elif verdict is not None:
        entry.verdict, entry.reason, entry.summary = verdict.verdict, verdict.reason, verdict.short_reason()
    entry.float64_rerun_seconds = run.explain_seconds
    return entry


def _fastest(figures) -> Optional[float]:
    return None if figures is None else figures[2]


def mark_fastest(entries: List[SweepEntry]) -> List[SweepEntry]:
    """Mark, at each device count, the DTensor mesh with the best ratio and the faster approach.

    Only configurations that matched the reference and have a ratio compete. Ratios, not raw
    figures: each is to its own reference, so the machine's drift between them cancels.
    """
    for count in dict.fromkeys(entry.devices for entry in entries):
        best = {}
        for trainer in ("dtensor", "mirrored"):
            timed = [
                e
                for e in entries
                if e.devices == count and e.trainer == trainer and e.parity_ok and e.ratio_to_reference is not None
            ]
            if timed:
                best[trainer] = max(timed, key=lambda e: e.ratio_to_reference)
        if "dtensor" in best:
            best["dtensor"].fastest_mesh = True
        if len(best) == 2:
            max(best.values(), key=lambda e: e.ratio_to_reference).faster_approach = True
    return entries


def format_entry_line(entry: SweepEntry) -> str:
    """The progress line printed as each configuration finishes: its figures and its verdict's keyword."""
    prefix = f"sweep      {entry.devices} devices  {entry.trainer:<9}{entry.label:<18}"
    if entry.skipped:
        return f"{prefix}skipped (the reason is under the table)"
    figure = "-" if entry.throughput_examples_per_s is None else f"{entry.throughput_examples_per_s:,.0f}"
    reference = "-" if entry.reference_examples_per_s is None else f"{entry.reference_examples_per_s:,.0f}"
    ratio = "" if entry.ratio_to_reference is None else f" ({entry.ratio_to_reference:.2f}x)"
    return f"{prefix}{figure} examples/s{ratio}, reference {reference}; parity {entry.verdict}"


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
    timed = [e for e in entries if e.parity_ok and e.ratio_to_reference is not None]
    if not timed:
        return ""
    best = max(timed, key=lambda e: e.ratio_to_reference)
    if best.ratio_to_reference > 1:
        return ""
    return (
        f"No configuration beat one device on this machine; the best: {best.trainer} {best.label} at "
        f"{best.devices} devices, {best.ratio_to_reference:.2f}x its reference"
    )
