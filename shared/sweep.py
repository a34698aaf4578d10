"""The device sweep: which approach, and which DTensor layout, trains fastest at each device count.

    python compare.py --sweep-devices 2,8 --data embedded                      # every layout
    python compare.py --sweep-devices 2,8 --data embedded --sweep-meshes batch  # batch=N only

At each device count N, `plan_sweep` lists DTensor on every mesh that N allows (every batch x
model factorisation, `dtensor_impl.mesh.every_mesh`; a width the model axis does not divide is
padded) and MirroredStrategy in each update mode (`--sweep-meshes batch`: DTensor on batch=N
and MirroredStrategy in the chosen mode only, the sweep before layouts were searched). A
configuration that cannot run (a batch axis that does not divide the global batch, say) is
listed as skipped, with the trainer's own one-line reason.

Each configuration trains beside a reference trained just before it, and its ratio is to that
reference: on a shared machine throughput drifts by tens of percent within a minute, so a
ratio to a reference measured minutes earlier would measure the drift. Both sides count their
fastest measured epoch (shared.history: after the first, no trace, at least the timing floor);
other processes only ever slow an epoch down. Parity is checked for every configuration. At
each count the fastest DTensor mesh and the faster approach are marked, by ratio.
Costs: a reference run per configuration (~3 s at the default settings), so the default sweep
of 2 and 8 devices (10 configurations) takes about two minutes on 2 cores.
"""
import dataclasses
from typing import List, Optional, Sequence

from dtensor_impl import trainer as dtensor_trainer
from dtensor_impl.mesh import MeshSpec, every_mesh
from mirrored_impl import trainer as mirrored_trainer
from shared.config import Config
from shared.errors import UsageError
from shared.history import throughput
from shared.memory import largest_total_bytes

SWEEP_MESHES = ("all", "batch")  # --sweep-meshes


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
    verdict: str = ""  # the verdict's line, e.g. "ok" or "float noise: float32 left its tolerance at step 76 ..."
    memory_per_device_bytes: int = 0  # the busiest device's weights + optimizer state
    error: str = ""  # the trainer (or its reference) raised: one line
    skipped: str = ""  # why this configuration did not run
    fastest_mesh: bool = False  # the DTensor mesh with the best ratio at this device count
    faster_approach: bool = False  # the better ratio of DTensor's fastest mesh and MirroredStrategy's best update

    @property
    def ok(self) -> bool:
        """For the run's verdict: it matched the reference, or it could not run (and says why)."""
        return self.parity_ok or bool(self.skipped)

    @property
    def label(self) -> str:
        return self.mesh or f"update {self.update}"


def _skip_reason(trainer_module, config: Config, devices: Sequence[str]) -> str:
    try:
        trainer_module.check_config(config, devices)
    except UsageError as error:
        return str(error)
    return ""


def plan_sweep(config: Config, counts: Sequence[int], meshes: str, all_devices: Sequence[str]) -> List[SweepPoint]:
    """Every configuration to train, count by count: DTensor's meshes, then MirroredStrategy's updates."""
    if meshes not in SWEEP_MESHES:
        raise UsageError(f"--sweep-meshes {meshes!r} is unknown; use all or batch")
    base = config.replace(quiet=True, checkpoint_dir=None, export=None, repeat=1)  # those are the main run's
    points = []
    for count in counts:
        devices = all_devices[:count]
        if "dtensor" in config.trainers:
            specs = every_mesh(count) if meshes == "all" else [MeshSpec(batch=count)]
            for spec in specs:
                point_config = base.replace(devices=count, mesh=str(spec), trainers=("dtensor",))
                points.append(SweepPoint(count, "dtensor", point_config, mesh=str(spec),
                                         skipped=_skip_reason(dtensor_trainer, point_config, devices)))
        if "mirrored" in config.trainers:
            updates = mirrored_trainer.UPDATE_MODES if meshes == "all" else (mirrored_trainer.update_mode(config),)
            for update in updates:
                point_config = base.replace(devices=count, mirrored_update=update, trainers=("mirrored",))
                points.append(SweepPoint(count, "mirrored", point_config, update=update,
                                         skipped=_skip_reason(mirrored_trainer, point_config, devices)))
    return points


def sweep_entry(point: SweepPoint, run, train_examples: int) -> SweepEntry:
    """The entry for `point` from its RunResult (the reference and the point's trainer); run None: skipped."""
    entry = SweepEntry(point.devices, point.trainer, point.mesh, point.update, None, None, None, False,
                       skipped=point.skipped)
    if run is None:
        return entry
    reference, result = run.results["reference"], run.results[point.trainer]
    entry.error = result.error or (f"reference: {reference.error}" if reference.failed else "")
    if not reference.failed:
        entry.reference_examples_per_s = _fastest(throughput(reference.history, train_examples))
    if not result.failed:
        entry.throughput_examples_per_s = _fastest(throughput(result.history, train_examples))
        entry.memory_per_device_bytes = largest_total_bytes(result.history.memory_per_device)
    if entry.throughput_examples_per_s is not None and entry.reference_examples_per_s:
        entry.ratio_to_reference = entry.throughput_examples_per_s / entry.reference_examples_per_s
    verdict = run.verdicts.get(point.trainer)
    entry.parity_ok = bool(verdict is not None and verdict.ok) and not run.results["reference"].failed
    entry.verdict = verdict.line() if verdict is not None else ""
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
            timed = [e for e in entries if e.devices == count and e.trainer == trainer
                     and e.parity_ok and e.ratio_to_reference is not None]
            if timed:
                best[trainer] = max(timed, key=lambda e: e.ratio_to_reference)
        if "dtensor" in best:
            best["dtensor"].fastest_mesh = True
        if len(best) == 2:
            max(best.values(), key=lambda e: e.ratio_to_reference).faster_approach = True
    return entries


def format_entry_line(entry: SweepEntry) -> str:
    """The progress line printed as each configuration finishes."""
    prefix = f"sweep      {entry.devices} devices  {entry.trainer:<9}{entry.label:<18}"
    if entry.skipped:
        return f"{prefix}skipped: {entry.skipped}"
    figure = "-" if entry.throughput_examples_per_s is None else f"{entry.throughput_examples_per_s:,.0f}"
    reference = "-" if entry.reference_examples_per_s is None else f"{entry.reference_examples_per_s:,.0f}"
    ratio = "" if entry.ratio_to_reference is None else f" ({entry.ratio_to_reference:.2f}x)"
    verdict = (f"parity {entry.verdict}" if entry.parity_ok
               else f"FAILED {entry.error or entry.verdict}".strip())
    return f"{prefix}{figure} examples/s{ratio}, reference {reference}; {verdict}"
