"""compare.py in one process: set up devices and data, check everything, train and judge, sweep, report.

    python compare.py --data embedded

Kept out of compare.py so that tests and other programs can import it; compare.py only parses
arguments. The training and judging themselves: shared/run/sequence.py.
"""

from typing import List, Optional, Sequence, Tuple

from dtensor_vs_mirrored.shared.config import BUILT_IN_MODELS, Config, option_flag
from dtensor_vs_mirrored.shared.console import fit_width
from dtensor_vs_mirrored.shared.devices import configure_determinism, configure_devices
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.judge.baseline import check_options
from dtensor_vs_mirrored.shared.judge.digest import data_sha256
from dtensor_vs_mirrored.shared.measure.history import throughput
from dtensor_vs_mirrored.shared.measure.peak import matmul_peak_gflops
from dtensor_vs_mirrored.shared.model.registry import definition_for
from dtensor_vs_mirrored.shared.report import outputs, saved
from dtensor_vs_mirrored.shared.report.header import header
from dtensor_vs_mirrored.shared.report.sweep import describe_plan
from dtensor_vs_mirrored.shared.run import kernels, sweep
from dtensor_vs_mirrored.shared.run.fit_options import check_fit_options
from dtensor_vs_mirrored.shared.run.run_options import check_run_options
from dtensor_vs_mirrored.shared.run.sequence import RunResult, describe_processes, train_all
from dtensor_vs_mirrored.shared.training import checkpoint
from dtensor_vs_mirrored.shared.training.data import Dataset, load_run_data
from dtensor_vs_mirrored.shared.training.keras_fit import check_fit_model
from dtensor_vs_mirrored.shared.training.registry import chosen, describe_runs, specs, with_trainers


def check_config(config: Config, devices: Sequence[str]) -> None:
    """Each chosen trainer's own checks (a mesh, a batch over replicas) before anything trains."""
    kernels.check(config, devices)  # a mixed run: its dtype's matmul, probed apart (a Keras model's load computes)
    definition_for(config)  # --model: a user's definition is loaded and checked here, once
    check_fit_model(config)  # --fit: a Keras model whose compile settings rebuild
    for spec in specs(chosen(config)):
        spec.check_config(config, devices)
    checkpoint.check_config(config)  # --restore, --checkpoint-dir, --export


def check_trainer_options(config: Config) -> None:
    """One line for an option that does nothing in this run: one that only a trainer not chosen reads (its spec's
    `options`), or --sharded-forward where no weight is split on the batch axis (a built-in model without
    --shard-weights, outside a sweep, whose sharded meshes split them; a model of yours may split its own); and
    --fit's checks (shared/run/fit_options.py), after the rules between options (shared/run/run_options.py), for
    a Config made in Python too."""
    check_run_options(config)
    check_fit_options(config)
    defaults, trainers = Config(), chosen(config)
    for spec in specs():
        for field, what in spec.options.items():
            if spec.name not in trainers and getattr(config, field) != getattr(defaults, field):
                advice = f"add {spec.name} to --trainers, or drop it"
                if config.fit and spec.name == "dtensor":
                    advice = "--fit trains no DTensor (Keras's model.fit has none): drop it"
                raise UsageError(f"{option_flag(field)} {what}; {advice}")
    splits = config.shard_weights or config.sweep_devices or config.model not in BUILT_IN_MODELS
    if config.sharded_forward != "auto" and not splits:
        raise UsageError(
            f"--sharded-forward {config.sharded_forward} chooses DTensor's forward of weights split on the batch "
            f"axis, and the built-in models split none without --shard-weights: add it, or drop --sharded-forward"
        )


def prepare(config: Config, sweep_devices: Sequence[int] = ()) -> Tuple[List[str], Dataset]:
    """Configure the largest device count once, validate, load data; all before any training.

    The sweep's configurations are checked when it is planned (a sweep configuration that
    cannot run is skipped, with the reason, rather than stopping the run)."""
    kernels.start(config)  # its TensorFlow import overlaps the set-up below (compare.py started it sooner)
    configure_determinism(config.deterministic)  # before any op runs
    device_count = max([config.devices, *sweep_devices])
    for spec in specs(chosen(config)):  # e.g. DTensor's NCCL: before anything starts TensorFlow's runtime
        spec.before_runtime(config, device_count)
    all_devices = configure_devices(device_count, config.device_type)
    check_config(config, all_devices[: config.devices])
    data = load_run_data(config)
    return all_devices, data


def run(config: Config) -> int:
    """compare.py's whole job in one process; returns the exit code (0 parity holds, 1 it does not)."""
    config = with_trainers(config)
    check_trainer_options(config)  # before anything is written or started
    outputs.check_outputs(config)
    saved_baseline = saved.load(config.baseline) if config.baseline else None
    all_devices, data = prepare(config, config.sweep_devices or ())
    if saved_baseline is not None:
        check_options(saved_baseline, config, data, data_sha256(data), config.baseline)
    plan = sweep.plan_sweep(config, all_devices)
    devices = all_devices[: config.devices]
    print(header(config, devices, data, describe_runs(config), describe_processes(config)))
    if plan:
        print(fit_width(describe_plan(config, plan), indent=2))
    main_run = train_all(config, data, devices, saved_baseline=saved_baseline)
    if plan:  # its first block times the main run's trainers too
        entries = sweep.run_sweep(config, data, all_devices, plan, main_run)
    else:  # what train_all left for a sweep that has no configuration
        entries = []
        main_run.time_what_is_left()
    main_run.matmul_peak_gflops = matmul_peak_for(main_run)  # after the timing: its figures set the peak beside it
    main_run.results["reference"].release()  # kept for timing beside it (shared/run/timing.py)
    return outputs.publish(config, main_run, entries)


def matmul_peak_for(run: RunResult) -> Optional[float]:
    """The matmul peak in the run's dtype (shared/measure/peak.py), the yardstick of the achieved GFLOP/s;
    None when no trainer has timed rounds or a measured epoch to set beside it (an untimed run of one epoch,
    or of epochs under the timing floor), rather than 1-3 s spent for nothing."""
    train_examples = len(run.data.y_train)
    if not any(throughput(result.history, train_examples) for result in run.results.values() if not result.failed):
        return None
    return matmul_peak_gflops(run.devices[0], dtype=run.config.compute_dtype)
