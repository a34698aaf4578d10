"""The comparison behind compare.py: set up devices and data, train, check parity, report.

Kept out of compare.py so that tests and other programs can import it; compare.py
only parses arguments.
"""

import dataclasses
import resource
import sys
import time
import traceback
from typing import Dict, List, Optional, Sequence

import tensorflow as tf

from shared import baseline, checkpoint, sweep
from shared.baseline import BaselineResult
from shared.benchmark import matmul_peak_gflops
from shared.config import Config
from shared.console import print_fitted
from shared.data import MnistData, batch_slices, load_data
from shared.devices import configure_determinism, configure_devices
from shared.digest import data_sha256
from shared.errors import UsageError
from shared.history import History, throughput
from shared.memory import with_peaks
from shared.models import definition_for
from shared.parity import Parity, check_parity
from shared.reproducibility import Repeatability, compare_runs
from shared.trainers import describe_runs, trainer_module
from shared.verdict import Verdict, judge


@dataclasses.dataclass
class TrainerResult:
    name: str
    history: Optional[History] = None
    error: str = ""  # one line when the trainer raised
    traceback: str = ""  # and its whole traceback, for the JSON report (and --verbose)
    peak_memory_mb: float = 0.0

    @property
    def failed(self) -> bool:
        return self.history is None


@dataclasses.dataclass
class RunResult:
    config: Config
    devices: List[str]
    data: MnistData
    results: Dict[str, TrainerResult]
    parity: Dict[str, Parity]
    # Measured after training, in the same process (shared/benchmark.py); None when no epoch was timed.
    matmul_peak_gflops: Optional[float] = None
    # shared/verdict.py: per distributed trainer (and "reference" if it diverged), the float64 rerun's
    # histories when a float32 failure was explained, and that rerun's wall time.
    verdicts: Dict[str, Verdict] = dataclasses.field(default_factory=dict)
    float64_histories: Dict[str, History] = dataclasses.field(default_factory=dict)
    explain_seconds: float = 0.0
    # float64 runs trained besides the explaining rerun (--with-float64, --baseline), and their wall time.
    more_float64_histories: Dict[str, History] = dataclasses.field(default_factory=dict)
    more_float64_seconds: float = 0.0
    reproducibility: Dict[str, Repeatability] = dataclasses.field(default_factory=dict)  # --repeat
    baseline: Optional[BaselineResult] = None  # --baseline (shared/baseline.py)

    @property
    def ok(self) -> bool:
        return not any(r.failed for r in self.results.values()) and all(v.ok for v in self.verdicts.values())

    @property
    def all_float64_histories(self) -> Dict[str, History]:
        return {**self.more_float64_histories, **self.float64_histories}


def check_config(config: Config, devices: Sequence[str]) -> None:
    """Each chosen trainer's own checks (a mesh, a batch over replicas) before anything trains."""
    definition_for(config)  # --model: a user's definition is loaded and checked here, once
    for name in config.trainers:
        check = getattr(trainer_module(name), "check_config", None)
        if check is not None:
            check(config, devices)
    checkpoint.check_config(config)  # --restore, --checkpoint-dir, --export


def peak_memory_mb(config: Config, devices: Sequence[str]) -> float:
    """GPU: TensorFlow's peak allocation summed over the devices. CPU: the process's peak RSS so far."""
    if config.device_type == "GPU":
        return sum(tf.config.experimental.get_memory_info(d)["peak"] for d in devices) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def train_one(name: str, config: Config, data: MnistData, devices: Sequence[str], log) -> TrainerResult:
    """Run one trainer; an exception becomes a failed result with a one-line reason."""
    if config.device_type == "GPU":
        for device in devices:
            tf.config.experimental.reset_memory_stats(device)
    try:
        history = trainer_module(name).fit(config, data, devices, log=log)
    except UsageError:
        raise
    except Exception as error:  # noqa: BLE001 - any trainer failure is reported, the others still run
        last = traceback.extract_tb(error.__traceback__)[-1]
        reason = (
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''} "
            f"({last.filename.rsplit('/', 1)[-1]}:{last.lineno})"
        )
        result = TrainerResult(name, error=reason.strip(), traceback="".join(traceback.format_exception(error)))
        if config.verbose:  # the one line is in the tables; a maintainer wants the whole story too
            print(f"{name}: FAILED: {result.error}\n{result.traceback}", end="", file=sys.stderr, flush=True)
        return result
    if config.device_type == "GPU":  # TensorFlow's own peak per device, beside the bytes the trainer holds
        history.memory_per_device = with_peaks(
            history.memory_per_device,
            {device: tf.config.experimental.get_memory_info(device)["peak"] for device in devices},
        )
    return TrainerResult(name, history, peak_memory_mb=peak_memory_mb(config, devices))


def train_all(config: Config, data: MnistData, devices: Sequence[str], log=print_fitted) -> RunResult:
    """Train the reference (always: it is the ground truth) and the chosen trainers, then check
    each distributed trainer's parity against the reference."""
    names = ["reference"] + [n for n in config.trainers if n != "reference"]
    if config.reference_from_scratch:  # every epoch from the initial values; compared after the restore point
        reference = train_one(
            "reference", config.replace(restore=None, reference_from_scratch=False), data, devices, log
        )
        if reference.history is not None:
            reference.history = after_restore_point(reference.history, config, len(data.y_train))
        results = {"reference": reference}
    else:
        results = {"reference": train_one("reference", config, data, devices, log)}
    results.update({name: train_one(name, config, data, devices, log) for name in names[1:]})

    def rerun(rerun_names):  # a float32 parity failure: the same run in float64, in this process
        return {name: rerun_one(name, float64_rerun_config(config), data, devices, log) for name in rerun_names}

    run = compare_results(config, devices, data, results, rerun, log=log)
    if config.repeat > 1:
        again = config.replace(
            quiet=True, checkpoint_dir=None, export=None, profile=False, link_gbps=None
        )  # the same run again
        run.reproducibility = {
            name: compare_runs(
                result.history, [train_one(name, again, data, devices, log) for _ in range(config.repeat - 1)]
            )
            for name, result in results.items()
            if result.history is not None
        }
    return run


def float64_runs(
    run: RunResult, names: Sequence[str], data: MnistData, devices: Sequence[str], log=print
) -> Dict[str, TrainerResult]:
    """This float32 run's float64 run of each of `names`, from the same start: the explaining rerun's where
    there is one, else trained now, quietly, and kept in the run (the report's `float64_rerun`)."""
    found = {
        name: TrainerResult(name, run.all_float64_histories[name])
        for name in names
        if name in run.all_float64_histories
    }
    missing = [name for name in names if name not in found]
    if missing:
        started = time.perf_counter()
        found.update({name: rerun_one(name, float64_rerun_config(run.config), data, devices, log) for name in missing})
        run.more_float64_seconds += time.perf_counter() - started
        run.more_float64_histories.update(
            {name: found[name].history for name in missing if found[name].history is not None}
        )
    return found


def why_no_float64(config: Config) -> str:
    """Why this run cannot train float64 runs of itself; "" when it can."""
    if config.restore:
        return "--restore starts from float32 state, which a float64 run cannot restore"
    return "" if config.explain else "--no-explain"


def compare_with_baseline(
    run: RunResult, saved: dict, path: str, data: MnistData, devices: Sequence[str], log=print
) -> None:
    """run.baseline: each trainer against the saved report (shared/baseline.py), training float64 runs if needed."""
    run.baseline = baseline.judge(
        run,
        saved,
        path,
        lambda names: float64_runs(run, names, data, devices, log),
        run.config.tolerance,
        why_no_float64(run.config),
    )


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


def rerun_one(name: str, config: Config, data: MnistData, devices: Sequence[str], log) -> TrainerResult:
    """train_one for the float64 rerun: a trainer that cannot run in float64 here (TensorFlow 2.12's
    DTensor) fails its rerun with the reason, after the float32 run has trained; no exit 2."""
    try:
        return train_one(name, config, data, devices, log)
    except UsageError as error:
        return TrainerResult(name, error=str(error))


def float64_rerun_config(config: Config) -> Config:
    """The run again in float64, quietly: no epoch lines, checkpoints, export or profile; float64's own tolerances."""
    return config.replace(
        dtype="float64", quiet=True, checkpoint_dir=None, export=None, tolerance=None, profile=False, link_gbps=None
    )


def compare_results(
    config: Config,
    devices: Sequence[str],
    data: MnistData,
    results: Dict[str, TrainerResult],
    rerun=None,
    no_rerun_reason: str = "",
    log=print_fitted,
) -> RunResult:
    """Parity of every trainer that finished against the reference in `results`, and each one's verdict.

    rerun(names) -> {name: TrainerResult} trains them in float64 to explain a float32 failure
    (shared/verdict.py); None where this process cannot, for `no_rerun_reason`.
    """
    reference = results["reference"].history
    parity = {
        name: check_parity(result.history, reference, config.tolerance)
        for name, result in results.items()
        if name != "reference" and result.history is not None and reference is not None
    }
    judgement = judge(config, results, parity, rerun, no_rerun_reason, log)
    return RunResult(
        config,
        list(devices),
        data,
        results,
        parity,
        verdicts=judgement.verdicts,
        float64_histories=judgement.float64_histories,
        explain_seconds=judgement.explain_seconds,
    )


def prepare(config: Config, sweep_devices: Sequence[int] = ()) -> (List[str], MnistData):
    """Configure the largest device count once, validate, load data; all before any training.

    The sweep's configurations are checked when it is planned (a sweep configuration that
    cannot run is skipped, with the reason, rather than stopping the run)."""
    configure_determinism(config.deterministic)  # before any op runs
    device_count = max([config.devices, *sweep_devices])
    for name in config.trainers:  # e.g. DTensor's NCCL: before anything starts TensorFlow's runtime
        getattr(trainer_module(name), "before_runtime", lambda *args: None)(config, device_count)
    all_devices = configure_devices(device_count, config.device_type)
    check_config(config, all_devices[: config.devices])
    data = load_data(config.data, config.train_examples, config.test_examples)
    return all_devices, data


def run(config: Config) -> int:
    """compare.py's whole job in one process; returns the exit code (0 parity holds, 1 it does not)."""
    from shared import report

    report.check_outputs(config)
    saved = baseline.load(config.baseline) if config.baseline else None
    all_devices, data = prepare(config, config.sweep_devices or ())
    if saved is not None:
        baseline.check_options(saved, config, data, data_sha256(data), config.baseline)
    plan = sweep.plan_sweep(config, all_devices)
    devices = all_devices[: config.devices]
    print(report.header(config, devices, data, describe_runs(config)))
    if plan:
        print(sweep.describe_plan(config, plan))
    main_run = train_all(config, data, devices)
    if config.with_float64 and config.dtype == "float32":
        float64_runs(main_run, [name for name, result in main_run.results.items() if not result.failed], data, devices)
    if saved is not None:
        compare_with_baseline(main_run, saved, config.baseline, data, devices)
    main_run.matmul_peak_gflops = matmul_peak_for(main_run)
    entries = run_sweep(config, data, all_devices, plan) if plan else []
    return report.publish(config, main_run, entries)


def matmul_peak_for(run: RunResult) -> Optional[float]:
    """The matmul peak in the run's dtype (shared/benchmark.py), the yardstick of the achieved GFLOP/s;
    None when no trainer has a timed epoch to set beside it (one epoch, or epochs under the timing
    floor), rather than 1-3 s spent for nothing."""
    train_examples = len(run.data.y_train)
    if not any(throughput(result.history, train_examples) for result in run.results.values() if not result.failed):
        return None
    return matmul_peak_gflops(run.devices[0], dtype=run.config.dtype)


def run_sweep(
    config: Config, data: MnistData, all_devices: Sequence[str], plan: Sequence[sweep.SweepPoint], log=print_fitted
) -> List[sweep.SweepEntry]:
    """Train each planned configuration beside a reference trained just before it (shared/sweep.py)."""
    entries = []
    for index, point in enumerate(plan):
        # The configurations train quietly; what their float32 failures' float64 reruns would log (two
        # lines each, shared/verdict.py) is summed up per device count below instead.
        run_at_point = (
            None
            if point.skipped
            else train_all(point.config, data, all_devices[: point.devices], log=lambda line: None)
        )
        entries.append(sweep.sweep_entry(point, run_at_point, len(data.y_train)))
        if not config.quiet:
            log(sweep.format_entry_line(entries[-1]))
            last_at_count = index + 1 == len(plan) or plan[index + 1].devices != point.devices
            summary = sweep.rerun_summary(entries, point.devices) if last_at_count else ""
            if summary:
                log(summary)
    return sweep.mark_fastest(entries)
