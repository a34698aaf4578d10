"""The sweep's record of each configuration, its marks and its conclusion (numbers in, marks out): at each
device count the fastest DTensor mesh and the faster approach, by ratio to the reference timed beside it; the
configuration that holds least per device, the one that sends fewest bytes per step, and those that fit a stated
memory per device. A ratio from fewer than MIN_RANKED_STEPS measured steps is too short to rank: a single short
epoch can crown a "faster approach" by noise. A ratio whose spread (the min-max of its rounds' ratios, each
beside the reference's) overlaps another's at its count is ranked but marked tied: their order was not measured."""

import dataclasses
from typing import Dict, List, Optional

SKIPPED, FAILED = "skipped", "FAILED"  # a sweep entry's verdict besides shared/judge/verdict.py's
# Measured steps below which a ratio is not ranked: the timed rounds give every configuration 30
# (shared/measure/timing.py); a float64 sweep, untimed, has its epochs after the first, which traces.
MIN_RANKED_STEPS = 30


def label(mesh: str, update: str, shard_weights: bool = False) -> str:
    """How tables name a configuration: "batch=4,model=2", "batch=8 sharded", "update primary"."""
    return (mesh + (" sharded" if shard_weights else "")) if mesh else f"update {update}"


@dataclasses.dataclass(kw_only=True)
class SweepEntry:
    devices: int
    trainer: str
    mesh: str  # DTensor's mesh; "" for MirroredStrategy
    update: str  # MirroredStrategy's update mode; "" for DTensor
    throughput_examples_per_s: Optional[float]  # its timed rounds' median (untimed: its fastest epoch); None: none
    reference_examples_per_s: Optional[float]  # the reference's, timed around this configuration's rounds
    ratio_to_reference: Optional[float]  # None when either figure is None
    parity_ok: bool  # its verdict is ok or float noise (shared/judge/verdict.py)
    # ok, float noise, MISMATCH or diverged (shared/judge/verdict.py); FAILED when it or its reference raised;
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
    collectives: Optional[object] = None  # shared.measure.traffic.Implementation its collectives ran with
    # --profile: shared.measure.profile.StepProfile, shared.measure.traffic.Traffic (bytes per step), or why it has none
    step_profile: Optional[object] = None
    traffic: Optional[object] = None
    traffic_missing: str = ""
    shard_weights: bool = False  # DTensor: weights and optimizer slots split on the batch axis too
    # steps timed (shared/run/timing.py; without timing, in the measured epochs), the fewer of its and its reference's
    measured_steps: int = 0
    too_short: bool = False  # fewer than MIN_RANKED_STEPS: shown, not ranked
    ratio_spread: Optional[List[float]] = None  # [min, max] of the ratios of its rounds, each beside the reference's
    tied: bool = False  # its spread overlaps another ranked configuration's at this count: their order is unmeasured

    @property
    def ok(self) -> bool:
        """For the run's verdict: it matched the reference, or it could not run (and says why)."""
        return self.parity_ok or bool(self.skipped)

    @property
    def label(self) -> str:
        return label(self.mesh, self.update, self.shard_weights)

    @property
    def link_bytes(self) -> Optional[int]:
        """What the busiest device sends or receives per step; None when its bytes were not counted."""
        return None if self.traffic is None else self.traffic.link_bytes

    @property
    def ranked(self) -> bool:
        return self.parity_ok and self.ratio_to_reference is not None and not self.too_short


def mark_fastest(entries: List[SweepEntry]) -> List[SweepEntry]:
    """Mark, at each device count, the mesh with the best ratio (DTensor's) and the faster approach.

    Only configurations that matched the reference and have a ratio from enough measured steps compete.
    Ratios, not raw figures: each is to the reference timed around it, so the machine's drift cancels.
    """
    for entry in entries:
        entry.too_short = entry.ratio_to_reference is not None and entry.measured_steps < MIN_RANKED_STEPS
    mark_ties(entries)
    for count in dict.fromkeys(entry.devices for entry in entries):
        best = {}
        for trainer in dict.fromkeys(entry.trainer for entry in entries):
            timed = [e for e in entries if e.devices == count and e.trainer == trainer and e.ranked]
            if timed:
                best[trainer] = max(timed, key=lambda e: e.ratio_to_reference)
        for entry in best.values():
            entry.fastest_mesh = bool(entry.mesh)  # a trainer of meshes (DTensor): its fastest one
        if len(best) > 1:
            max(best.values(), key=lambda e: e.ratio_to_reference).faster_approach = True
    return entries


def spread(entry: SweepEntry) -> List[float]:
    """[min, max] of its ratio: its rounds', or the one figure's when it has no rounds."""
    return entry.ratio_spread or [entry.ratio_to_reference, entry.ratio_to_reference]


def overlap(entry: SweepEntry, other: SweepEntry) -> bool:
    return spread(other)[0] <= spread(entry)[1] and spread(entry)[0] <= spread(other)[1]


def mark_ties(entries: List[SweepEntry]) -> None:
    """`tied`: a ranked entry whose spread overlaps another ranked entry's at the same count."""
    for entry in entries:
        entry.tied = entry.ranked and any(
            other is not entry and other.ranked and other.devices == entry.devices and overlap(entry, other)
            for other in entries
        )


def best_when_none_beat_one_device(entries: List[SweepEntry]) -> Optional[SweepEntry]:
    """The configuration with the best ratio to its reference among those that matched it, when none beat one
    device (ratio above 1); None when one did, or none has a ratio."""
    timed = [e for e in entries if e.parity_ok and e.ratio_to_reference is not None]
    best = max(timed, key=lambda e: e.ratio_to_reference, default=None)
    return best if best is not None and best.ratio_to_reference <= 1 else None


@dataclasses.dataclass
class Conclusion:
    """What the sweep found at one device count, for the run's model."""

    devices: int
    fastest: Optional[SweepEntry] = None  # the best ratio among the ranked configurations
    least_memory: Optional[SweepEntry] = None  # the smallest weights + optimizer state on the busiest device
    fewest_bytes: Optional[SweepEntry] = None  # the fewest bytes per step on the busiest link
    fitting: Optional[List[SweepEntry]] = None  # within the stated memory per device (None: none stated)
    too_short: int = 0  # configurations measured on too few steps to rank
    tied: Optional[List[SweepEntry]] = None  # ranked configurations whose spread overlaps another's
    rivals: Optional[List[SweepEntry]] = None  # those whose spread overlaps the fastest's: it may not be


def conclude(entries: List[SweepEntry], device_memory_bytes: Optional[int] = None) -> Dict[int, Conclusion]:
    """Per device count, among the configurations that matched the reference (parity ok or float noise)."""
    found = {}
    for count in dict.fromkeys(entry.devices for entry in entries):
        matched = [e for e in entries if e.devices == count and e.parity_ok]
        conclusion = Conclusion(count, too_short=sum(e.too_short for e in entries if e.devices == count))
        ranked = [e for e in matched if e.ranked]
        conclusion.fastest = max(ranked, key=lambda e: e.ratio_to_reference, default=None)
        conclusion.tied = [e for e in ranked if e.tied]
        conclusion.rivals = [e for e in ranked if e is not conclusion.fastest and overlap(e, conclusion.fastest)]
        conclusion.least_memory = min(matched, key=lambda e: e.memory_per_device_bytes, default=None)
        counted = [e for e in matched if e.link_bytes is not None]
        conclusion.fewest_bytes = min(counted, key=lambda e: e.link_bytes, default=None)
        if device_memory_bytes is not None:
            conclusion.fitting = [e for e in matched if e.memory_per_device_bytes <= device_memory_bytes]
        found[count] = conclusion
    return found
