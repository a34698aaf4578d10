"""The one function that sequences a run: the reference, each trainer, the float64 reruns that explain a
float32 failure, --repeat, --with-float64 and the baseline's float64 runs, then the verdicts.

compare.py (shared/run/comparison.py), each configuration of the sweep, --clients (shared/run/clients.py)
and shared.api.check_model all call `train_and_judge` with a RunPlan (shared/run/plan.py): what differs between
them is in the plan (how one trainer is trained, `Train`: here, in trainer processes or in client processes; timed
or not; what is already trained). The judge (shared/judge/) gets numbers and says which trainers need a float64
run; only this module trains them.
"""

import dataclasses
import functools
import itertools
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

import tensorflow as tf

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.console import print_fitted
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.judge import baseline, verdict
from dtensor_vs_mirrored.shared.judge.baseline import BaselineResult
from dtensor_vs_mirrored.shared.judge.first_difference import FirstDifference
from dtensor_vs_mirrored.shared.judge.parity import Parity, check_parity
from dtensor_vs_mirrored.shared.judge.repeats import Repeatability, compare_runs
from dtensor_vs_mirrored.shared.measure.history import History
from dtensor_vs_mirrored.shared.measure.timing import REFERENCE_ROUND_STEPS as STEPS
from dtensor_vs_mirrored.shared.measure.timing import wanted as timed_run
from dtensor_vs_mirrored.shared.model.registry import definition_for, random_ops
from dtensor_vs_mirrored.shared.run import replay, timing, worker
from dtensor_vs_mirrored.shared.run.lanes import (
    REFERENCE_LANE,
    Pending,
    lane_count,
    own_process,
    queued,
    reference_apart,
)
from dtensor_vs_mirrored.shared.run.plan import Entry, RunPlan, Train, lineup
from dtensor_vs_mirrored.shared.run.results import TrainerResult, train_one
from dtensor_vs_mirrored.shared.training import checkpoint
from dtensor_vs_mirrored.shared.training.batches import batch_slices
from dtensor_vs_mirrored.shared.training.data import Dataset
from dtensor_vs_mirrored.shared.training.protocol import PLAIN_RUN, RunControl
from dtensor_vs_mirrored.shared.training.registry import (
    cautions_for,
    chosen,
    distributed,
    kept_untrained,
    specs,
    trainer_spec,
)


@dataclasses.dataclass(kw_only=True)
class RunResult:
    config: Config
    devices: List[str]
    data: Dataset
    results: Dict[str, TrainerResult]
    parity: Dict[str, Parity]
    # Measured after training, in the same process (shared/measure/peak.py); None when no epoch was timed.
    matmul_peak_gflops: Optional[float] = None
    # shared/judge/verdict.py: per distributed trainer (and "reference" if it diverged), the float64 rerun's
    # histories when a float32 failure was explained, and that rerun's wall time.
    verdicts: Dict[str, verdict.Verdict] = dataclasses.field(default_factory=dict)
    float64_histories: Dict[str, History] = dataclasses.field(default_factory=dict)
    explain_seconds: float = 0.0
    # float64 runs trained besides the explaining rerun (--with-float64, --baseline), and their wall time.
    more_float64_histories: Dict[str, History] = dataclasses.field(default_factory=dict)
    more_float64_seconds: float = 0.0
    reproducibility: Dict[str, Repeatability] = dataclasses.field(default_factory=dict)  # --repeat
    baseline: Optional[BaselineResult] = None  # --baseline (shared/judge/baseline.py)
    # train_all before a sweep: its distributed trainers trained beside the reference, kept untimed for the sweep's
    # first block to time (shared/run/sweep.py Blocks.first).
    time_later: bool = False

    def time_what_is_left(self) -> None:
        """What train_all left untimed (time_later), timed alone beside the reference, as a run without a sweep is:
        where no block of the sweep times it (shared/run/sweep.py Blocks.first). Once timed, nothing is left."""
        if self.time_later:
            timing.time_run(self.results)

    @property
    def ok(self) -> bool:
        return not any(r.failed for r in self.results.values()) and all(v.ok for v in self.verdicts.values())

    @property
    def all_float64_histories(self) -> Dict[str, History]:
        return {**self.more_float64_histories, **self.float64_histories}


def in_process(data: Dataset, devices: Sequence[str], log=print_fitted) -> Train:
    """Train each entry in this process, on the first `devices` its configuration asks for."""

    def train(entry: Entry, config: Config, control: RunControl = PLAIN_RUN) -> TrainerResult:
        result = train_one(entry.trainer, config, data, devices[: config.devices], log, control)
        result.name = entry.key
        return result

    return train


def describe_processes(config: Config) -> str:
    """The header's line on where each trainer trains and with which threads; "" when all train here. It names what
    the chosen trainers ask of their process (another's part, DTensor's for a MirroredStrategy run, is left out)."""
    names = distributed(chosen(config))
    if not names or not own_process(config):
        return ""
    apart = ["reference"] if reference_apart(config) else []
    settings, asked = {}, {v for name in apart + names for v in trainer_spec(name).process_environment(config)}
    for name in apart + names:
        environment = {k: v for k, v in process_environment(name, config).items() if k in asked}
        settings.setdefault(" ".join(f"{k}={v}" for k, v in sorted(environment.items())), []).append(name)
    own = "; ".join(
        f"{_and(group)} in a trainer process" + (f" ({setting})" if setting else "")
        for setting, group in settings.items()
    )
    if apart:  # its runs round as each device's: one intra-op thread (shared/run/lanes.py reference_apart)
        timed = "; the reference's timing rounds here (TensorFlow's default threads)" if timed_run(config) else ""
        line = f"processes: {own}{timed}"
    else:
        line = f"processes: the reference here (TensorFlow's default threads); {own}"
    if config.sweep_devices and lane_count(config) > 1:  # train_all
        lanes = f"{_and(names)} train side by side, one a core, as the sweep's configurations do,"
        line += (
            f"; {lanes if len(names) > 1 else names[0] + ' trains in its process'} while the reference trains"
            f"{' in its own' if apart else ' here'}: the epoch and trace times ran beside other work (the speeds are"
            " the timing rounds', taken alone)"
        )
    return line


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def process_environment(trainer: str, config: Config) -> Dict[str, str]:
    """The environment of `trainer`'s process: what every distributed trainer asks for with this configuration (each
    spec's `process_environment`, chosen or not: a sweep's configuration names only its own trainer) together, so
    that they share one process; its own where two ask for different values of one variable."""
    own = trainer_spec(trainer).process_environment(config)
    together = dict(own)
    for spec in filter(lambda spec: spec.distributes, specs()):
        for variable, value in spec.process_environment(config).items():
            if together.setdefault(variable, value) != value:
                return own
    return together


class TrainedBy:
    """How compare.py trains (a Train): each approach in its trainer process (own_process), with the run's environment
    for it (process_environment), or here; the reference's runs in one with one intra-op thread (reference_apart), its
    timing rounds here, or all of it here; `lane`: which of a sweep's processes for that environment
    (shared/run/lanes.py), the reference's `reference_lane` on the first (REFERENCE_LANE where it trains beside the
    others' lanes)."""

    def __init__(self, data: Dataset, devices: Sequence[str], log=print_fitted, lane: int = 0, reference_lane: int = 0):
        self.data, self.devices, self.log, self.lane, self.reference_lane = data, devices, log, lane, reference_lane
        self.here = in_process(data, devices, log)

    def process(self, trainer: str, config: Config) -> Optional[worker.TrainerProcess]:
        """The trainer process that trains `trainer` with `config`; None where it trains here (train_all starts a
        lane's processes early)."""
        spec = trainer_spec(trainer)
        if not own_process(config) or not (spec.distributes or reference_apart(config)):
            return None
        # As many logical devices as this process has: one trainer process serves every count of a sweep.
        count = max(len(self.devices), len(tf.config.list_logical_devices(config.device_type)))
        own_lane = self.lane if spec.distributes or self.lane else self.reference_lane
        return worker.trainer_process(process_environment(trainer, config), config, count, own_lane)

    def __call__(self, entry: Entry, config: Config, control: RunControl = PLAIN_RUN) -> TrainerResult:
        found = self.process(entry.trainer, config)
        if found is None:
            return self.here(entry, config, control)
        if trainer_spec(entry.trainer).distributes or not control.keep:
            result = found.train(entry.trainer, config, self.data, self.log, control)
        else:  # the reference: timed here, with TensorFlow's default threads, on one made while its run trains there
            devices = self.devices[: config.devices]
            made = in_a_thread(lambda: kept_untrained(entry.trainer, config, self.data, devices, STEPS))
            try:
                result = found.train(
                    entry.trainer, config, self.data, self.log, dataclasses.replace(control, keep=False)
                )
            finally:
                kept = untimed_on_error(made)  # waited for however the run ended: no TensorFlow left working
            result.kept = None if result.failed else kept
        result.name = entry.key
        return result


def in_a_thread(make: Callable[[], object]) -> Callable[[], object]:
    """`make()` called in a thread of its own, now; returns what waits for it and returns what it made (or raises
    what it raised)."""
    made = Pending()

    def run() -> None:
        try:
            made.settle(make())
        except BaseException as error:  # noqa: BLE001 - raised in the caller's thread, where it waits
            made.settle(error=error)

    threading.Thread(target=run, daemon=True).start()
    return made.result


def untimed_on_error(made: Callable[[], object]) -> Optional[object]:
    """The timing reference `made` (in_a_thread), or None where it could not be made or warmed (a --fit reference
    has no steady call): no figure then, as a round that fails (shared/run/timing.py timed_round), not a failed run."""
    try:
        return made()
    except Exception:  # noqa: BLE001 - the speeds then come from the epochs
        return None


def float64_config(config: Config, dtype: str = "float64") -> Config:
    """The run again in float64 (or `dtype`: a mixed run's float32 rerun), quietly: no epoch lines, checkpoints,
    export or profile; that dtype's own tolerances."""
    return config.replace(
        dtype=dtype, quiet=True, checkpoint_dir=None, export=None, tolerance=None, profile=False, link_gbps=None
    )


def repeat_config(config: Config) -> Config:
    """--repeat: the same run again, quietly and writing nothing."""
    return config.replace(quiet=True, checkpoint_dir=None, export=None, profile=False, link_gbps=None)


def why_no_float64(config: Config) -> str:
    """Why this run cannot train float64 runs of itself; "" when it can."""
    if config.restore:
        return "--restore starts from float32 state, which a float64 run cannot restore"
    return "" if config.explain else "--no-explain"


def pinned_entry(entry: Entry, results: Dict[str, TrainerResult]) -> Entry:
    """`entry` as its float64 run trains it: with what its float32 run (in `results`) chose pinned (its spec's
    `pinned`: DTensor's forward of weights split on the batch axis), so that the rerun computes the program it
    explains and traces nothing that run already chose between."""
    result = results.get(entry.key)
    if result is None or result.history is None:
        return entry
    return dataclasses.replace(entry, config=trainer_spec(entry.trainer).pinned(entry.config, result.history))


def train_float64(train: Train, entry: Entry, control: RunControl = PLAIN_RUN, dtype: str = "float64") -> TrainerResult:
    """An entry's float64 run (or `dtype`'s): a trainer that cannot run in float64 here (TensorFlow 2.12's DTensor)
    fails its rerun with the reason, after the float32 run has trained; no exit 2."""
    try:
        return train(entry, float64_config(entry.config, dtype), control)
    except UsageError as error:
        return TrainerResult(entry.key, error=str(error))


def train_and_judge(plan: RunPlan) -> RunResult:
    """Train the plan's entries, time them (where the plan is timed), judge each against the reference, train the
    float64 runs the judge asks for and locate each mismatch's first difference, name what may cause a failure, then
    --repeat's, --with-float64's and --baseline's runs; return the whole run."""
    results = train_entries(plan)
    if plan.control.keep and not plan.time_later:
        timing.time_run(results, plan.reference.key, trained_reference=plan.reference_result is None)
    parity, judgement = judge(plan.config, {key: r.history for key, r in results.items()}, plan.no_float64_reason)
    float64_entries = [pinned_entry(entry, results) for entry in plan.entries]  # their float32 runs' choices pinned
    explain(plan.config, judgement, parity, float64_entries, plan.train, plan.log, plan.lanes)
    locate_differences(plan.config, judgement.verdicts, float64_entries, results, plan.train, plan.log)
    name_random_ops(plan.config, judgement.verdicts, results)
    name_cautions(plan.config, judgement.verdicts, results, plan.entries, plan.train_examples)
    run = RunResult(
        config=plan.config,
        devices=list(plan.devices),
        data=plan.data,
        results=results,
        parity=parity,
        verdicts=judgement.verdicts,
        float64_histories=judgement.float64_histories,
        explain_seconds=judgement.explain_seconds,
        time_later=plan.control.keep and plan.time_later,
    )
    more_runs(run, plan.entries, plan.train, plan.saved_baseline)
    return run


def train_entries(plan: RunPlan) -> Dict[str, TrainerResult]:
    """Each entry's run by key, the reference's first: the plan's reference_result or trained by this thread, while
    the others not already trained train on the plan's lanes (side_by_side), or after it in turn."""
    reference, others, results, control = plan.reference, plan.entries[1:], {}, plan.control
    trained = dict(plan.trained)
    waiting = [entry for entry in others if entry.key not in trained]

    def train_the_reference(beside_lanes: bool) -> None:
        here = dataclasses.replace(control, progress_bar=control.progress_bar and not beside_lanes)
        results[reference.key] = plan.reference_result or train_reference(
            plan.train, reference, plan.train_examples, here
        )

    trained.update(side_by_side(waiting, plan.lanes, control, meanwhile=train_the_reference))
    results.update({entry.key: trained.get(entry.key) or plan.train(entry, entry.config, control) for entry in others})
    return results


def judge(config: Config, histories: Dict[str, Optional[History]], no_float64_reason: str = ""):
    """(parity of each trainer against the reference, the judge's judgement: shared.judge.verdict.judge) for a run's
    histories ({name: None} for a failed trainer)."""
    parity = {
        key: check_parity(history, histories["reference"], config.tolerance)
        for key, history in histories.items()
        if key != "reference" and history is not None and histories["reference"] is not None
    }
    return parity, verdict.judge(config, histories, parity, definition_for(config).summarise_state, no_float64_reason)


def side_by_side(
    entries: Sequence[Entry],
    lanes: Sequence[Train],
    control: RunControl,
    run: Optional[Callable] = None,
    meanwhile: Callable[[bool], None] = lambda beside_lanes: None,
) -> Dict[str, TrainerResult]:
    """`entries` trained on `lanes` at once (`run(train, entry)`: by default as `control` says), each lane taking
    the next when it is free, while `meanwhile(True)` (the reference's run) is called here; with fewer than two
    lanes, `meanwhile(False)` alone, and {} (the caller trains them in turn, after it: a plain run's times stay
    uncontended). Its argument says whether the lanes train beside it: then it draws no progress bar
    (RunControl.progress_bar; the first lane's process draws one)."""
    if len(lanes) < 2 or not entries:
        meanwhile(False)
        return {}
    run = run or (lambda train, entry: train(entry, entry.config, control))
    jobs = [lambda train, entry=entry: run(train, entry) for entry in entries]
    outcomes = queued(jobs, lanes, lambda: meanwhile(True))
    return {entry.key: outcome.result() for entry, outcome in zip(entries, outcomes)}


def explain(config: Config, judgement, parity, entries: Sequence[Entry], train: Train, log, lanes=()) -> None:
    """The float64 reruns the judge asks for, of the reference and each trainer whose float32 parity failed (those
    on `lanes`, two at a time, where the run has them), and the judge's verdicts from them. A mixed run's failures
    rerun in float32 first, and those whose float32 rerun fails too in float64 (shared/judge/mixed.py)."""
    while judgement.needs_float64:
        rerun_wider(config, judgement, parity, entries, train, log, lanes)


def rerun_wider(config: Config, judgement, parity, entries: Sequence[Entry], train: Train, log, lanes=()) -> None:
    """One round of `explain`: the reference and judgement.needs_float64 in judgement.rerun_dtype, then the verdicts."""
    dtype, between = judgement.rerun_dtype, judgement.between
    for key in judgement.needs_float64:
        log(verdict.rerun_line(key, between.get(key, parity[key]), dtype))
    started = time.perf_counter()
    wanted = [entry for entry in entries if entry.key in judgement.needs_float64]
    reruns = {}
    rerun = train_float64 if dtype == "float64" else functools.partial(train_float64, dtype=dtype)

    def rerun_the_reference(beside_lanes: bool) -> None:  # by this thread, while the lanes rerun the others
        reruns[entries[0].key] = rerun(train, entries[0], RunControl(progress_bar=not beside_lanes))

    on_lanes = side_by_side(wanted, lanes, PLAIN_RUN, rerun, rerun_the_reference)
    reruns.update((entry.key, on_lanes.get(entry.key) or rerun(train, entry)) for entry in wanted)
    seconds = time.perf_counter() - started
    log(f"{dtype} rerun of reference, {', '.join(judgement.needs_float64)}: {seconds:.1f} s")
    verdict.explain(judgement, parity, reruns, definition_for(config).summarise_state, seconds)


def more_runs(run: RunResult, entries: Sequence[Entry], train: Train, saved_baseline: Optional[dict]) -> None:
    """--repeat's runs, --with-float64's and --baseline's, into `run`."""
    config, results = run.config, run.results
    if config.repeat > 1:
        run.reproducibility = {
            entry.key: compare_runs(
                results[entry.key].history,
                [train(entry, repeat_config(entry.config)) for _ in range(config.repeat - 1)],
            )
            for entry in entries
            if results[entry.key].history is not None
        }
    if config.with_float64 and config.dtype == "float32":
        float64_runs(run, [entry for entry in entries if not results[entry.key].failed], train)
    if saved_baseline is not None:
        judge_baseline(run, entries, train, saved_baseline)


NO_REPLAY_WITH_CLIENTS = (
    "the replay restores a checkpoint in one process: run this trainer without --clients to locate it"
)


def locate_differences(config, verdicts, entries, results, train: Train, log) -> None:
    """Each MISMATCH's first differing tap: its first mismatching step replayed in float64 (shared/run/replay.py) as
    `entries` say (their float32 runs' choices pinned: pinned_entry), into the verdict and its reason. Not with
    --no-explain or --restore (no float64 run), nor for a difference only in the final weights, nor for a forward
    without a context (it taps nothing), nor --fit's model.fit."""
    if why_no_float64(config) or not definition_for(config).takes_context or config.fit:  # --fit: Keras's loop
        return
    for entry in entries[1:]:
        found = verdicts.get(entry.key)
        steps = len(results[entry.key].history.step_losses) if not results[entry.key].failed else 0
        if found is None or found.verdict != verdict.MISMATCH or found.first_disagreeing_step is None:
            continue
        step = max(found.first_disagreeing_step, 0)
        if step >= steps:
            continue
        if config.clients > 1:  # a checkpoint to restore, a replay to run: one process's (--restore with --clients)
            found.first_difference = FirstDifference(step, "", "", 0.0, [], 0.0, NO_REPLAY_WITH_CLIENTS)
            found.add_reason(found.first_difference.line())
            continue
        log(f"replaying step {step} of {entry.key} and the reference in float64 to find the first tap that differs")
        found.first_difference = replay.first_difference(entry, entries[0], entry.config, train, step, float64_config)
        log(f"{entry.key}: {found.first_difference.line()} ({found.first_difference.seconds:.1f} s)")
        found.add_reason(found.first_difference.line())


def name_random_ops(config, verdicts, results) -> None:
    """When a trainer fails or mismatches and the forward draws its own random numbers, say so in its reason."""
    if all(not result.failed for result in results.values()) and all(
        v.verdict != verdict.MISMATCH for v in verdicts.values()
    ):
        return
    found = random_ops(definition_for(config))
    if not found:
        return
    hint = (
        f"the forward draws its own random numbers ({', '.join(found)}), which DTensor and MirroredStrategy draw "
        f'differently on their devices; draw them with context.dropout (docs/models.md, "Randomness")'
    )
    for key, result in results.items():
        if result.failed and key != "reference":
            result.error += f"; {hint}"
        elif key in verdicts and verdicts[key].verdict == verdict.MISMATCH:
            verdicts[key].add_reason(hint)


def name_cautions(config, verdicts, results, entries: Sequence[Entry], train_examples: int) -> None:
    """The run's cautions (shared.model.Caution: a Keras BatchNormalization without synchronized=True; with --fit,
    model.fit's) in the reason of each trainer they name that mismatches or fails."""
    cautions = cautions_for(config, train_examples)
    for entry in entries:
        texts = [caution.text for caution in cautions if entry.trainer in caution.trainers and caution.in_reason]
        result, found = results[entry.key], verdicts.get(entry.key)
        for text in texts:
            if result.failed and entry.key != "reference":
                result.error += f"; {text}"
            elif found is not None and found.verdict == verdict.MISMATCH:
                found.add_reason(text)


def main_run_lanes(
    config: Config, data: Dataset, devices: Sequence[str], log: Callable = print_fitted
) -> List[TrainedBy]:
    """train_all's Train for each lane: one for a plain run, whose trace and epoch times stay uncontended, the sweep's
    lanes before a sweep; the reference's runs, which the first trains while the lanes train the others (the main
    run's, its float64 reruns), then in a process of their own (REFERENCE_LANE)."""
    count = lane_count(config) if config.sweep_devices else 1
    return [TrainedBy(data, devices, log, lane, REFERENCE_LANE if count > 1 else 0) for lane in range(count)]


def train_all(
    config: Config, data: Dataset, devices: Sequence[str], log: Callable = print_fitted, saved_baseline=None
) -> RunResult:
    """The run that `config` describes on `devices`: compare.py's main run; before a sweep that trains its
    configurations side by side, its distributed trainers too, while the reference trains, and left for the sweep's
    first block to time (shared/run/lanes.py)."""
    lanes = main_run_lanes(config, data, devices, log)
    count = len(lanes)
    # Their processes load TensorFlow at once: the lanes' while the reference trains, the reference's (reference_apart)
    # while this process makes its timing reference.
    wanted = ["reference"] if reference_apart(config) else []
    for lane, name in itertools.product(lanes, wanted + (distributed(chosen(config)) if count > 1 else [])):
        found = lane.process(name, config)
        if found is not None:
            found.started()
    plan = RunPlan(
        config=config,
        data=data,
        devices=devices,
        entries=lineup(config),
        train=lanes[0],
        log=log,
        lanes=lanes,
        timed=True,
        time_later=count > 1,
        saved_baseline=saved_baseline,
    )
    return train_and_judge(plan)


def train_reference(train: Train, entry: Entry, train_examples: int, control: RunControl = PLAIN_RUN) -> TrainerResult:
    """The reference; with --reference-from-scratch trained from the initial values for every epoch and cut
    to the steps after the restore point."""
    config = entry.config
    if not config.reference_from_scratch:
        return train(entry, config, control)
    result = train(entry, config.replace(restore=None, reference_from_scratch=False), control)
    if result.history is not None:
        result.history = after_restore_point(result.history, config, train_examples)
    return result


def float64_runs(run: RunResult, entries: Sequence[Entry], train: Train) -> Dict[str, TrainerResult]:
    """This float32 run's float64 run of each entry, from the same start: the explaining rerun's where there
    is one, else trained now, quietly, and kept in the run (the report's `float64_rerun`)."""
    found = {
        entry.key: TrainerResult(entry.key, run.all_float64_histories[entry.key])
        for entry in entries
        if entry.key in run.all_float64_histories
    }
    missing = [entry for entry in entries if entry.key not in found]
    if missing:
        started = time.perf_counter()
        found.update({entry.key: train_float64(train, pinned_entry(entry, run.results)) for entry in missing})
        run.more_float64_seconds += time.perf_counter() - started
        run.more_float64_histories.update(
            {entry.key: found[entry.key].history for entry in missing if found[entry.key].history is not None}
        )
    return found


def judge_baseline(run: RunResult, entries: Sequence[Entry], train: Train, saved: dict) -> None:
    """run.baseline: each trainer against the saved report, with float64 runs where float32 left its tolerance."""
    histories = {key: result.history for key, result in run.results.items()}
    run.baseline = baseline.judge(histories, saved, run.config.baseline, run.config.dtype, run.config.tolerance)
    wanted = baseline.float64_needed(run.baseline)
    why_not = why_no_float64(run.config)
    float64 = float64_runs(run, [e for e in entries if e.key in wanted], train) if wanted and not why_not else {}
    baseline.explain_pending(run.baseline, float64, why_not)


def after_restore_point(history: History, config: Config, train_examples: int) -> History:
    """--reference-from-scratch: the part of an uninterrupted `history` that runs resumed from --restore train,
    step for step: the epochs after the checkpoint's, without first-step gradients (these are at the
    initial values; the resumed trainers' at the restore point), so parity does not judge them."""
    restored_epoch = int(checkpoint.check_restore(config)[1]["epoch"])
    steps = restored_epoch * len(batch_slices(train_examples, config.batch_size))
    details = dict(
        history.details,
        from_scratch=f"trained epochs 1..{config.epochs} from the initial values; "
        f"compared and reported from epoch {restored_epoch + 1}",
    )
    return dataclasses.replace(
        history,
        step_losses=history.step_losses[steps:],
        step_times_ms=history.step_times_ms[steps:],
        epochs=[record for record in history.epochs if record.epoch > restored_epoch],
        step_state_checksums=history.step_state_checksums[steps:],
        first_step_gradients=[],
        details=details,
    )
