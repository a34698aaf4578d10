"""The run's whole configuration: one frozen dataclass, checked once when it is made.

compare.py's argparse fills it and nothing past compare.py reads flags; the Python API
(shared/api.py) and the --clients launcher make it directly (a client gets it as JSON). A bad
value raises UsageError with the line compare.py prints, so every caller gets the same errors.
"""

import dataclasses
import json
import math
from typing import Optional, Tuple

from shared.errors import UsageError

TRAINER_NAMES = ("reference", "dtensor", "mirrored")
DTYPES = ("float32", "float64")  # --dtype: the tf/numpy dtype names of the weights, slots, losses and inputs
CHOICES = {  # field: its values, as --help lists them
    "device_type": ("CPU", "GPU"),
    "optimizer": ("adam", "sgd"),
    "adam": ("fixed", "tutorial"),
    "dtype": DTYPES,
    "dtensor_input": ("pack", "dataset"),
    "mirrored_update": ("auto", "primary", "replicas"),
    "sweep_meshes": ("all", "batch"),
}
# The options that change the numbers a run computes: a --baseline report must have the same (shared/baseline.py),
# and the same data (its sha256). Devices, mesh, clients, --dtensor-input, --mirrored-update and --deterministic
# change only which kernels run and the order of roundings, which is what the comparison judges; they may differ.
NUMERIC_OPTIONS = (
    "model",
    "epochs",
    "batch_size",
    "learning_rate",
    "seed",
    "optimizer",
    "adam",
    "dtype",
    "hidden",
    "shuffle",
    "restore",
)


@dataclasses.dataclass(frozen=True)
class Config:
    trainers: Tuple[str, ...] = TRAINER_NAMES
    devices: int = 8  # logical devices per process; 8 virtual CPUs as in the tutorial
    clients: int = 1  # processes (hosts) in one run: >1 is multi-client DTensor / MultiWorkerMirroredStrategy
    device_type: str = "CPU"
    mesh: Optional[str] = None  # "batch=B[,model=M]"; None means batch=devices (pure data parallel)
    epochs: int = 3
    batch_size: int = 128  # global batch: what one optimizer step sees, summed over all devices
    learning_rate: float = 1e-3
    seed: int = 22  # initial values use stateless seed (seed, seed + 1), as the tutorial's (22, 23)
    optimizer: str = "adam"  # SGD exposes gradient-scale bugs that Adam hides
    adam: str = "fixed"  # "tutorial" keeps the tutorial's read-after-assign and frozen step count
    data: str = "auto"  # "auto", "tfds", "embedded" or a directory of MNIST IDX files
    train_examples: Optional[int] = None  # None: the source's default (tfds/IDX 5000, embedded 4000)
    test_examples: Optional[int] = None  # None: the source's default (tfds/IDX 5000, embedded 1000)
    model: str = "mlp"  # "mlp", "vit", or FILE.py:FUNCTION returning a ModelDefinition (shared/models.py)
    hidden: Optional[Tuple[int, ...]] = None  # the MLP's hidden layer sizes; None: the tutorial's 700,500
    shuffle: bool = False  # the tutorial does not shuffle; True reshuffles every epoch from `seed`
    dtensor_input: str = "pack"  # "pack" (tutorial: split + dtensor.pack) or "dataset" (DTensorDataset)
    mirrored_update: str = "auto"  # auto: primary in one process, replicas with --clients
    # float64 starts from the float32 initial values, widened: the same model from the same start, with
    # rounding ~1e9 times smaller, so parity can be judged on every step of any run (docs/parity.md).
    dtype: str = "float32"
    tolerance: Optional[float] = None  # atol and rtol of loss and gradients; weights get 10x. None: shared.parity's
    explain: bool = True  # on a float32 parity failure, rerun in float64 to tell float noise from a real difference
    # Also train every trainer in float64 and keep it in the report, so that a later --baseline against this
    # report can tell float32 noise from a change (shared/baseline.py); about doubles the training time.
    with_float64: bool = False
    repeat: int = 1  # train each trainer this many times from the same start; >1 reports reproducibility
    # tf.config.experimental.enable_op_determinism(), for the whole process, before any op runs
    # (docs/reproducibility.md)
    deterministic: bool = False
    baseline: Optional[str] = None  # a report --json wrote: this run is judged against it too (shared/baseline.py)
    # Outputs, each written atomically; None: not written.
    json: Optional[str] = None  # the JSON report
    plots: Optional[str] = None  # a directory for the PNGs (shared/plots.py)
    logdir: Optional[str] = None  # TensorBoard scalars per trainer
    # The device sweep (shared/sweep.py): each count's meshes and update modes, each beside its own reference.
    sweep_devices: Optional[Tuple[int, ...]] = None
    sweep_meshes: str = "all"  # "batch": DTensor on batch=N and the chosen MirroredStrategy update only
    # After training, trace each trainer's steady train call: its step's parts and bytes per device (shared/profile.py).
    profile: bool = False
    link_gbps: Optional[float] = None  # with profile: the least time the bytes take over links of G Gbit/s
    # On GPUs, DTensor's collectives use NCCL where TensorFlow allows it (one physical GPU per device); False
    # leaves TensorFlow's default, its own ring collectives (dtensor_impl/nccl.py). CPUs have no NCCL.
    dtensor_nccl: bool = True
    # Checkpoints and export (shared/checkpoint.py, shared/export.py); None: off.
    checkpoint_dir: Optional[str] = None  # DIR/<trainer>/epoch-NNNN after every epoch, each complete or absent
    keep_checkpoints: int = 3  # the newest N epochs stay per trainer, older ones are deleted; 0 keeps all
    restore: Optional[str] = None  # a checkpoint any trainer wrote (or DIR/<trainer>: its newest); epochs continue
    # With restore: the reference trains every epoch from the initial values instead of resuming, and parity
    # is judged on the steps after the restore point: a resumed run against an uninterrupted one.
    reference_from_scratch: bool = False
    export: Optional[str] = None  # DIR/<trainer>: a SavedModel of plain variables, loadable without mesh or strategy
    quiet: bool = False  # no per-epoch lines
    verbose: bool = False  # TensorFlow's own log lines, and a failed trainer's traceback under its one line
    result_file: Optional[str] = None  # a --clients client writes its result here for the launcher

    def __post_init__(self):
        check(self)

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Config":
        fields = json.loads(text)
        tuples = {"trainers", "hidden", "sweep_devices"}
        return cls(
            **{name: tuple(value) if name in tuples and value is not None else value for name, value in fields.items()}
        )


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def check(config: Config) -> None:
    """Every value, then every combination, as compare.py states them (UsageError, one line)."""

    def fail(field: str, message: str):
        raise UsageError(f"argument {flag(field)}: {message}")

    unknown = [name for name in config.trainers if name not in TRAINER_NAMES]
    if unknown or not config.trainers:
        shown = ",".join(unknown) if unknown else repr(",".join(config.trainers))
        fail("trainers", f"unknown trainer {shown}; choose from {','.join(TRAINER_NAMES)}")
    for field in ("devices", "clients", "batch_size", "repeat", "train_examples", "test_examples"):
        value = getattr(config, field)
        if value is not None and value < 1:
            fail(field, f"{value} is not a positive integer")
    for field in ("epochs", "seed", "keep_checkpoints"):
        if getattr(config, field) < 0:
            fail(field, f"{getattr(config, field)} is negative")
    for field in ("learning_rate", "tolerance", "link_gbps"):
        value = getattr(config, field)
        if value is not None and not math.isfinite(value):
            fail(field, f"{value} is not a finite number")
        if value is not None and not value > 0:
            fail(field, f"{value} is not a positive number")
    for field in ("hidden", "sweep_devices"):
        values = getattr(config, field)
        if values is not None and (not values or any(value < 1 for value in values)):
            fail(field, f"{','.join(map(str, values))!r}: every value must be a positive integer")
    for field, choices in CHOICES.items():
        if getattr(config, field) not in choices:
            fail(
                field,
                f"invalid choice: {getattr(config, field)!r} (choose from "
                f"{', '.join(repr(choice) for choice in choices)})",
            )
    check_combinations(config)


def check_combinations(config: Config) -> None:
    if config.link_gbps and not config.profile:
        raise UsageError("--link-gbps turns the bytes that --profile counts into time; add --profile")
    if config.hidden is not None and config.model != "mlp":
        raise UsageError(f"--hidden sets the MLP's layers; drop it, or use --model mlp (not {config.model})")
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
        files = [flag(field) for field in ("checkpoint_dir", "restore", "export") if getattr(config, field)]
        if files:
            raise UsageError(
                f"{', '.join(files)} with --clients {config.clients} is not supported yet; use --clients 1"
            )
        if config.mirrored_update == "primary" and "mirrored" in config.trainers:
            raise UsageError(
                f"--mirrored-update primary needs one process, not --clients {config.clients}; "
                f"use --mirrored-update replicas (or auto)"
            )
        if config.dtensor_input != "pack" and "dtensor" in config.trainers:
            raise UsageError(
                f"--dtensor-input {config.dtensor_input} is not supported with --clients "
                f"{config.clients}; use --dtensor-input pack (each client packs its own shards)"
            )
