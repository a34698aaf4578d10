"""The device sweep: which approach, and which DTensor layout, trains fastest at each device count.

    python compare.py --sweep-devices 2,8 --data embedded                      # every layout
    python compare.py --sweep-devices 2,8 --data embedded --sweep-meshes batch  # batch=N only

At each count every trainer offers its configurations (DTensor each mesh, MirroredStrategy each
update mode: its spec's `variants`); one that cannot run is skipped with the trainer's reason, and one
the main run trained is taken from it. Each is judged against the main run's reference (which computes
the same run at any count) and timed beside it, round by round (shared/run/timing.py: the machine's
speed drifts within minutes). The fastest DTensor mesh and the faster approach are marked by ratio.
What the figures mean: docs/throughput.md; measurements and costs: docs/measurements.md.
"""

import dataclasses
import time
from typing import Dict, List, Optional, Sequence, Tuple

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.console import print_fitted
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.judge.ranking import FAILED, SKIPPED, SweepEntry, label, mark_fastest
from dtensor_vs_mirrored.shared.measure.history import History, measured_steps, throughput
from dtensor_vs_mirrored.shared.measure.memory import largest_total_bytes
from dtensor_vs_mirrored.shared.report.sweep import format_entry_line, rerun_summary
from dtensor_vs_mirrored.shared.run import timing
from dtensor_vs_mirrored.shared.run.lanes import BLOCK_LANES, lane_count, queued
from dtensor_vs_mirrored.shared.run.plan import Entry, RunPlan, Train, lineup, timed_control
from dtensor_vs_mirrored.shared.run.results import TrainerResult
from dtensor_vs_mirrored.shared.run.sequence import (
    RunResult,
    TrainedBy,
    float64_config,
    judge,
    pinned_entry,
    train_and_judge,
    train_float64,
)
from dtensor_vs_mirrored.shared.training.data import Dataset
from dtensor_vs_mirrored.shared.training.protocol import PLAIN_RUN, RunControl
from dtensor_vs_mirrored.shared.training.registry import chosen, distributed, trainer_spec


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepPoint:
    """One configuration to train: a trainer, at a device count, on a mesh or in an update mode."""

    devices: int
    trainer: str  # a distributed trainer's name
    config: Config  # the run's, with this count, mesh or update; the reference trains beside it
    mesh: str = ""  # DTensor's, e.g. "batch=4,model=2"
    update: str = ""  # MirroredStrategy's: "primary" or "replicas"
    skipped: str = ""  # why it cannot run (the trainer's check, one line); "" when it can
    shard_weights: bool = False  # DTensor's weights split on the batch axis too (--shard-weights)
    cost: float = 1.0  # how long it trains, relative (Variant.cost): the sweep trains the costliest first

    @property
    def label(self) -> str:
        return label(self.mesh, self.update, self.shard_weights)


def _skip_reason(spec, config: Config, devices: Sequence[str]) -> str:
    try:
        spec.check_config(config, devices)
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
        device_memory_mb=None,
        json=None,
        plots=None,
        logdir=None,
        baseline=None,
        with_float64=False,
    )
    points = []
    for count in config.sweep_devices or ():
        for name in distributed(chosen(config)):
            spec = trainer_spec(name)
            for variant in spec.variants(base.replace(trainers=(name,)), count, config.sweep_meshes == "all"):
                skipped = _skip_reason(spec, variant.config, all_devices[:count])
                points.append(
                    SweepPoint(
                        devices=count,
                        trainer=name,
                        config=variant.config,
                        mesh=variant.mesh,
                        update=variant.update,
                        skipped=skipped,
                        shard_weights=variant.shard_weights,
                        cost=variant.cost,
                    )
                )
    return points


def sweep_entry(
    point: SweepPoint, run, train_examples: int, beside_another: bool = False, rerun_seconds: Optional[float] = None
) -> SweepEntry:
    """The entry for `point` from its RunResult (the reference and the point's trainer); run None: skipped.
    `beside_another`: it trained while another lane did (shared/run/lanes.py), so its epochs' times are no figure.
    `rerun_seconds`: its float64 reruns' own seconds where the lanes trained them (Blocks.rerun), not explain's."""
    entry = SweepEntry(
        devices=point.devices,
        trainer=point.trainer,
        mesh=point.mesh,
        update=point.update,
        throughput_examples_per_s=None,
        reference_examples_per_s=None,
        ratio_to_reference=None,
        parity_ok=False,
        skipped=point.skipped,
        shard_weights=point.shard_weights,
    )
    if run is None:
        entry.verdict, entry.reason = SKIPPED, point.skipped
        return entry
    reference, result = run.results["reference"], run.results[point.trainer]
    entry.error = result.error or (f"reference: {reference.error}" if reference.failed else "")
    if not result.failed:
        entry.memory_per_device_bytes = largest_total_bytes(result.history.memory_per_device)
        entry.collectives, entry.step_profile = result.history.collectives, result.history.step_profile
        entry.traffic, entry.traffic_missing = result.history.traffic, result.history.traffic_missing
        if not reference.failed:
            speed(entry, reference.history, result.history, train_examples, beside_another)
    verdict = run.verdicts.get(point.trainer)
    entry.parity_ok = bool(verdict is not None and verdict.ok) and not run.results["reference"].failed
    if entry.error:
        entry.verdict, entry.reason = FAILED, entry.error
    elif verdict is not None:
        entry.verdict, entry.reason, entry.summary = verdict.verdict, verdict.reason, verdict.short_reason()
    seconds = run.explain_seconds if rerun_seconds is None else rerun_seconds
    entry.float64_rerun_seconds = seconds if point.trainer in run.float64_histories else 0.0
    return entry


def speed(
    entry: SweepEntry, reference: History, history: History, train_examples: int, beside_another: bool = False
) -> None:
    """The entry's examples/s, its reference's and their ratio: from the rounds timed side by side
    (shared/run/timing.py), the ratio the median of the pairs' with their min-max; without them from each side's
    fastest measured epoch, as before timing (a float64 sweep), unless it trained `beside_another`: then none."""
    timing = history.timing
    if timing is not None and timing.beside:
        entry.throughput_examples_per_s = timing.throughput()[0]
        entry.reference_examples_per_s = timing.reference_throughput()[0]
        ratio, low, high = timing.ratio()
        entry.ratio_to_reference, entry.ratio_spread, entry.measured_steps = ratio, [low, high], timing.steps
        return
    if beside_another:
        return
    entry.reference_examples_per_s = _fastest(throughput(reference, train_examples))
    entry.throughput_examples_per_s = _fastest(throughput(history, train_examples))
    if entry.throughput_examples_per_s is not None and entry.reference_examples_per_s:
        entry.ratio_to_reference = entry.throughput_examples_per_s / entry.reference_examples_per_s
        entry.measured_steps = min(measured_steps(reference), measured_steps(history))


def _fastest(figures) -> Optional[float]:
    return None if figures is None else figures[2]


def trained_by_main_run(point: SweepPoint, main_run: RunResult) -> bool:
    """Whether the main run trained `point`'s configuration (at --devices, as its trainer's details describe it), so
    that its run and timing serve the sweep too."""
    result = main_run.results.get(point.trainer)
    if point.skipped or result is None or result.failed or point.devices != main_run.config.devices:
        return False
    details = result.history.details
    return (
        details.get("mesh", "") == point.mesh
        and details.get("update", "") == point.update
        and bool(details.get("shard_weights")) == point.shard_weights
    )


def reference_once(train: Train, main_run: RunResult, done: Dict[str, TrainerResult], reruns=None) -> Train:
    """The sweep's Train: the reference's float64 run (the float32 one is the main run's) trained once for every
    configuration, or taken from the main run: it depends on no device count, mesh or update (`done`, by dtype);
    a float64 rerun the lanes trained already (`reruns`, by key and config: Blocks.rerun) is taken from them."""
    if "reference" in main_run.float64_histories:
        done["float64"] = TrainerResult("reference", main_run.float64_histories["reference"])
    reruns = {} if reruns is None else reruns

    def sweep_train(entry: Entry, config: Config, control: RunControl = PLAIN_RUN) -> TrainerResult:
        if control == PLAIN_RUN and (entry.key, config) in reruns:
            return reruns.pop((entry.key, config))
        if entry.trainer != "reference" or control != PLAIN_RUN:
            return train(entry, config, control)
        if config.dtype not in done:
            done[config.dtype] = train(entry, config, control)
        return done[config.dtype]

    return sweep_train


class Blocks:
    """With more than one lane (shared/run/lanes.py): the configurations the sweep trains, a block of BLOCK_LANES a
    lane at a time, each lane taking the next when it is free, all kept, then timed together beside the reference,
    round by round (shared/run/timing.py), and let go; with one lane, none (run_sweep trains each in its turn). The
    costliest configurations (each spec's Variant.cost) train first, so that the lanes finish a block close
    together."""

    def __init__(self, config: Config, data: Dataset, all_devices: Sequence[str], plan, main_run: RunResult, done):
        self.lanes, self.plan, self.reference = lane_count(config), plan, main_run.results["reference"]
        self.done = done  # the reference's runs by dtype (reference_once)
        self.reruns: Dict[Tuple[str, Config], TrainerResult] = {}  # float64 reruns by (key, config): rerun
        self.rerun_seconds: Dict[int, float] = {}  # their lanes' seconds by plan index
        to_train = [i for i, point in enumerate(plan) if not point.skipped and not trained_by_main_run(point, main_run)]
        to_train.sort(key=lambda i: -plan[i].cost)  # stable: plan order among equals
        self.indices = to_train if self.lanes > 1 and len(to_train) > 1 else []
        self.size = self.lanes * BLOCK_LANES
        silent = lambda line: None  # noqa: E731
        self.trains = [TrainedBy(data, all_devices, log=silent, lane=lane) for lane in range(self.lanes)]
        self.trained: Dict[int, Dict[str, TrainerResult]] = {}
        self.main_run = main_run  # its kept trainers untimed where train_all left them (time_later): the first block's

    def first(self) -> None:
        """The first block trained and timed now, the main run's trainers timed in its rounds; with no block (one lane,
        or fewer than two configurations to train), those alone beside the reference (as a run without a sweep), so
        that the main run's configurations have their ratios before the sweep reports any."""
        if self.indices:
            self.take_block(self.indices[0])
        else:
            self.main_run.time_what_is_left()

    def take(self, index: int) -> Optional[Dict[str, TrainerResult]]:
        """The trained (and timed) runs of plan[index]'s trainer, by key, its block trained first if it has not
        been; None where run_sweep trains it itself."""
        if index not in self.indices:
            return None
        if index not in self.trained:
            self.take_block(index)
        return self.trained.pop(index)

    def take_block(self, index: int) -> None:
        """Train the block of plan[index], time it beside the reference (the main run's untimed trainers first, and
        the reference's own figure from these rounds where it has none yet), and rerun its float32 failures in
        float64."""
        start = self.indices.index(index) // self.size * self.size
        block = self.indices[start : start + self.size]
        outcomes = queued([self.job(self.plan[i]) for i in block], self.trains)
        self.trained.update((i, outcome.result()) for i, outcome in zip(block, outcomes))
        results = [result for i in block for result in self.trained[i].values() if result.history is not None]
        timing.time_run(self.main_run.results, also=results)
        self.rerun(block)

    def rerun(self, block: Sequence[int]) -> None:
        """The float64 reruns that the judge will ask for (a float32 failure: shared.judge.verdict.judge), the
        reference's first if it has none, trained on the lanes as the block was, two at a time where one trained
        after the other (each a minute of the MLP's sweep where float32 leaves its tolerance: an AVX2-only CPU)."""
        wanted = [
            (i, pinned_entry(entry, self.trained[i]))
            for i in block
            for entry in lineup(self.plan[i].config)[1:]
            if self.fails(i, entry)
        ]
        if wanted and "float64" not in self.done:
            wanted.insert(0, (wanted[0][0], lineup(self.plan[wanted[0][0]].config)[0]))

        def job(entry: Entry):
            def run(train: Train) -> Tuple[TrainerResult, float]:
                started = time.perf_counter()
                return train_float64(train, entry), time.perf_counter() - started

            return run

        for (i, entry), outcome in zip(wanted, queued([job(entry) for _, entry in wanted], self.trains)):
            try:
                result, seconds = outcome.result()
            except Exception:  # noqa: BLE001 - explain trains it again, in its turn
                continue
            self.rerun_seconds[i] = self.rerun_seconds.get(i, 0.0) + seconds
            if entry.trainer == "reference":
                self.done["float64"] = result
            else:
                self.reruns[entry.key, float64_config(entry.config)] = result

    def fails(self, index: int, entry: Entry) -> bool:
        """Whether the judge will rerun `entry` of plan[index] in float64 (its float32 parity failed)."""
        result, config = self.trained[index].get(entry.key), self.plan[index].config
        if result is None or result.failed or self.reference.failed:
            return False
        _, judgement = judge(config, {"reference": self.reference.history, entry.key: result.history})
        return entry.key in judgement.needs_float64

    @staticmethod
    def job(point: SweepPoint):
        def run(train: Train) -> Dict[str, TrainerResult]:
            control = timed_control(point.config, True, evaluate=False)
            return {entry.key: train(entry, entry.config, control) for entry in lineup(point.config)[1:]}

        return run


def run_sweep(
    config: Config,
    data: Dataset,
    all_devices: Sequence[str],
    plan: Sequence[SweepPoint],
    main_run: RunResult,
    log=print_fitted,
) -> List[SweepEntry]:
    """Train each planned configuration (or take the main run's), timed beside the main run's reference, which is
    also every configuration's parity reference (shared/run/timing.py)."""
    entries = []
    silent = lambda line: None  # noqa: E731 - the configurations train quietly
    done: Dict[str, TrainerResult] = {}
    blocks = Blocks(config, data, all_devices, plan, main_run, done)
    train = reference_once(TrainedBy(data, all_devices, log=silent), main_run, done, blocks.reruns)
    if blocks.indices and not config.quiet:
        log(
            f"sweep: {len(blocks.indices)} configurations trained {blocks.lanes} at a time, then timed in blocks of "
            f"up to {blocks.size}, the first with the main run's trainers, their rounds in turn between the reference's"
        )
    blocks.first()
    for index, point in enumerate(plan):
        # What their float32 failures' float64 reruns would log (two lines each) is summed up per count below.
        run_at_point = main_run if trained_by_main_run(point, main_run) else None
        if not point.skipped and run_at_point is None:
            point_plan = RunPlan(
                config=point.config,
                data=data,
                devices=all_devices[: point.devices],
                entries=lineup(point.config),
                train=train,
                log=silent,
                timed=True,
                evaluate=False,
                reference_result=main_run.results["reference"],
                trained=blocks.take(index) or {},
            )
            run_at_point = train_and_judge(point_plan)
        # Its epochs ran beside other work: a block's, or the main run's beside the reference (train_all).
        beside = index in blocks.indices or (run_at_point is main_run and main_run.time_later)
        seconds = blocks.rerun_seconds.get(index)
        entries.append(sweep_entry(point, run_at_point, len(data.y_train), beside, seconds))
        if not config.quiet:
            log(format_entry_line(entries[-1]))
            last_at_count = index + 1 == len(plan) or plan[index + 1].devices != point.devices
            summary = rerun_summary(entries, point.devices) if last_at_count else ""
            if summary:
                log(summary)
    return mark_fastest(entries)
