"""The rules between a run's options, checked where a Config enters a run (compare.py's flags before --clients
starts a process, check_model's keywords), without TensorFlow: the model's (model_options.py), an option that
needs another (--link-gbps --profile, --reference-from-scratch --restore), and what --clients cannot do yet.
--fit's own: fit_options.py; a trainer's: its spec."""

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError, flag
from dtensor_vs_mirrored.shared.run.model_options import check_model_options


def check_run_options(config: Config) -> None:
    """UsageError, one line, for options that do not go together."""
    if config.device_memory_mb is not None and not config.sweep_devices:
        raise UsageError("--device-memory-mb names the sweep's configurations that fit; add --sweep-devices")
    if config.link_gbps and not config.profile:
        raise UsageError("--link-gbps turns the bytes that --profile counts into time; add --profile")
    check_model_options(config)
    if config.with_float64 and config.restore:
        raise UsageError(
            f"--with-float64 cannot start a float64 run from the float32 checkpoint --restore "
            f"{config.restore}; drop one of them"
        )
    if config.reference_from_scratch and not config.restore:
        raise UsageError(
            "--reference-from-scratch compares trainers resumed from a checkpoint with a reference "
            "trained from the initial values; give --restore PATH too"
        )
    if config.clients > 1:
        check_clients_options(config)


def check_clients_options(config: Config) -> None:
    """--clients C > 1: each client is a process that trains one trainer; what needs one process is refused."""
    one_process = [
        (flag(field), on)
        for field, on in (
            ("sweep_devices", config.sweep_devices),
            ("repeat", config.repeat > 1),
            ("baseline", config.baseline),
            ("with_float64", config.with_float64),
            ("profile", config.profile),
        )
    ]
    for name, on in one_process:
        if on:
            raise UsageError(f"{name} runs in one process; drop it, or drop --clients")
    if config.trainer_process == "own":
        raise UsageError(
            "--trainer-process own: with --clients each client is a process of its own and trains its trainers "
            "there; drop it"
        )
    files = [flag(field) for field in ("checkpoint_dir", "restore", "export") if getattr(config, field)]
    if files:
        raise UsageError(f"{', '.join(files)} with --clients {config.clients} is not supported yet; use --clients 1")
