"""The run's whole configuration: one frozen dataclass, checked once when it is made.

Each field declares its compare.py option once, with option(): help, --help group, metavar and how
the text is parsed; compare.py makes its parser from the fields and nothing past compare.py reads
flags. The Python API (shared/api.py) and the --clients launcher make a Config directly (a client
gets it as JSON, shared/run/options.py). A bad value raises UsageError with the line compare.py prints, so
every caller gets the same errors. A rule that needs to know a trainer (what --fit can train, a mesh) is checked
where a run starts, beside that knowledge (shared/run/fit_options.py, each trainer's spec), not here.
"""

import argparse
import dataclasses
import json
import math
from typing import Optional, Tuple

from dtensor_vs_mirrored.shared.errors import UsageError

# The trainers (shared/training/registry.py registers each one's spec; a test keeps the two equal) and the
# built-in models (shared/model/registry.py): named here, at the bottom, where every layer can read them.
TRAINER_NAMES = ("reference", "dtensor", "mirrored")
FIT_TRAINERS = ("reference", "mirrored")  # --fit's: model.fit on one device, and under MirroredStrategy
BUILT_IN_MODELS = ("mlp", "vit", "gpt")
SHARDED_FORWARDS = ("auto", "gather", "expand")  # --sharded-forward: DTensor's forward of batch-split weights
TUTORIAL_HIDDEN = (700, 500)  # the MLP's hidden layers, --hidden's default (None)
# --dtype's mixed policies (Keras's names) -> the dtype the forward and backward compute in; weights, optimizer
# state, the loss and the gradients' combining stay float32 (docs/parity.md, "Mixed precision").
MIXED_COMPUTE = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
# --help's groups; the fields' order is their order, and the options' order within each.
WHERE = "what trains where"
MODEL = "the model"
RUN = "the training run (the same for every trainer)"
DATA = "data"
DISTRIBUTE = "how each approach distributes"
PARITY = "parity"
REPRODUCIBILITY = "reproducibility and baselines"
OUTPUTS = "outputs"
SPEED = "speed"
CHECKPOINTS = "checkpoints and export"
PRINTED = "what is printed"


def option(default, help: str, group: str, *, metavar=None, parse=None, flag=None, choices=None):
    """A Config field that is also a compare.py option: its help and --help group, the metavar, `parse` (argparse's
    type: the text to the value; None keeps the text) and `flag` (default: flag(name); a bool field is a switch
    that flips its default). `choices` are shown as the metavar {a,b} and checked by check(), not by argparse, so
    the Python API gets the same error."""
    if choices is not None:
        metavar = "{" + ",".join(choices) + "}"
    metadata = {"help": help, "group": group, "metavar": metavar, "parse": parse, "flag": flag, "choices": choices}
    return dataclasses.field(default=default, metadata=metadata)


def _name_list(text: str) -> Tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def int_list(text: str) -> Tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


@dataclasses.dataclass(frozen=True)
class Config:
    trainers: Tuple[str, ...] = option(
        TRAINER_NAMES, "comma-separated trainers to run: " + ",".join(TRAINER_NAMES), WHERE, parse=_name_list
    )
    devices: int = option(8, "logical devices (per client)", WHERE, parse=int)  # 8 virtual CPUs, as in the tutorial
    clients: int = option(
        1,
        "processes, each with --devices logical devices: DTensor multi-client and "
        "MultiWorkerMirroredStrategy; started here on loopback ports unless the environment names "
        "this process's cluster (DTENSOR_CLIENT_ID.. or TF_CONFIG; docs/multi-machine.md)",
        WHERE,
        parse=int,
    )
    device_type: str = option(
        "CPU",
        "logical CPUs (one physical CPU split) or GPUs (one physical GPU split if needed)",
        WHERE,
        parse=str.upper,
        choices=("CPU", "GPU"),
    )
    mesh: Optional[str] = option(None, "DTensor mesh batch=B[,model=M] (default: batch=DEVICES)", WHERE)
    # The loop most users run: model.fit, on one device and under MirroredStrategy (shared/training/keras_fit.py).
    fit: bool = option(
        False,
        "train your Keras model (--model FILE.py:FUNCTION) with Keras's own model.fit and its own compile settings: "
        "on one device as the reference, under MirroredStrategy as mirrored (the default trainers then), judged "
        "step by step (docs/keras.md)",
        WHERE,
    )

    model: str = option(
        "mlp",
        "mlp (the tutorial's), vit (a small Vision Transformer), gpt (a character GPT on tiny Shakespeare), "
        "or FILE.py:FUNCTION returning a dtensor_vs_mirrored.shared.model.ModelDefinition (examples/my_model.py)",
        MODEL,
    )
    hidden: Optional[Tuple[int, ...]] = option(
        None, f"the MLP's hidden layer sizes (default: {','.join(map(str, TUTORIAL_HIDDEN))})", MODEL, parse=int_list
    )
    dropout: float = option(
        0.0,
        "the built-in models' dropout rate in training, drawn alike by every trainer (ForwardContext.dropout, "
        "docs/models.md); your model calls context.dropout itself (default: 0, none)",
        MODEL,
        metavar="RATE",
        parse=float,
    )

    epochs: int = option(3, "passes over the training set", RUN, parse=int)
    # what one optimizer step sees, summed over all devices
    batch_size: int = option(128, "global batch size", RUN, parse=int)
    learning_rate: float = option(1e-3, "Adam or SGD step size", RUN, parse=float)
    seed: int = option(  # the tutorial's seed: its initial values use (22, 23)
        22, "initial values use stateless seed (SEED, SEED+1); also the --shuffle seed", RUN, parse=int
    )
    optimizer: str = option(
        "adam", "sgd exposes gradient-scale errors that Adam's normalisation hides", RUN, choices=("adam", "sgd")
    )
    adam: str = option(
        "fixed",
        "tutorial: the tutorial's Adam (read-after-assign, frozen step count)",
        RUN,
        choices=("fixed", "tutorial"),
    )
    # Clipped where each trainer combines its gradients, before its optimizer: the global gradient's norm.
    clip_global_norm: Optional[float] = option(
        None,
        "clip the gradient to global norm X after it is combined across devices, on the reference, DTensor and "
        "MirroredStrategy alike (not with --fit: Keras's own clipnorm, global_clipnorm and clipvalue, set in "
        "compile, clip each replica's part of it; docs/keras.md) (default: none)",
        RUN,
        metavar="X",
        parse=float,
    )
    # float64: the same model from the same start with rounding ~1e9 times smaller, so parity can be judged on
    # every step of any run. The names are the tf/numpy dtype of the weights, slots, losses and inputs.
    dtype: str = option(
        "float32",
        "of weights, Adam slots and losses; float64 starts from the float32 initial values widened, "
        "and its parity is judged on every step with far tighter tolerances; mixed_bfloat16 and mixed_float16 "
        "compute the forward and backward in bfloat16 or float16 from float32 weights, mixed_float16 with "
        "dynamic loss scaling (docs/parity.md)",
        RUN,
        choices=("float32", "float64", *MIXED_COMPUTE),
    )
    shuffle: bool = option(False, "reshuffle the training set every epoch from --seed", RUN)  # the tutorial does not

    data: str = option(
        "auto",
        "auto, tfds, embedded (the model's own data: MNIST, tiny Shakespeare), a directory of MNIST IDX "
        "files, or FILE.npz of your arrays x_train, y_train, x_test, y_test",
        DATA,
    )
    train_examples: Optional[int] = option(
        None, "training examples (default: tfds/IDX 5000, embedded 4000)", DATA, parse=int
    )
    test_examples: Optional[int] = option(
        None, "test examples (default: tfds/IDX 5000, embedded 1000)", DATA, parse=int
    )

    dtensor_input: str = option(
        "pack",
        "DTensor input: split + dtensor.pack per batch, or dtensor.DTensorDataset",
        DISTRIBUTE,
        choices=("pack", "dataset"),
    )
    dtensor_nccl: bool = option(
        True,
        "on GPUs, leave DTensor's collectives on TensorFlow's ring instead of NCCL (DTensor's own default; "
        "default: NCCL wherever TensorFlow allows it, one physical GPU per device; CPUs have no NCCL)",
        DISTRIBUTE,
        flag="--no-dtensor-nccl",
    )
    shard_weights: bool = option(
        False,
        "DTensor: also split every weight and its optimizer slots over the batch axis (sharded data "
        "parallel, as FSDP and ZeRO-3), on a dimension the batch axis divides; what cannot be split "
        "stays replicated and is named (docs/approaches.md)",
        DISTRIBUTE,
    )
    sharded_forward: str = option(
        "auto",
        "DTensor, weights split on the batch axis (--shard-weights, the sweep's sharded meshes): gather all-gathers "
        "them for the forward (FSDP's), expand leaves them to DTensor's SPMD expansion, auto traces a step each way "
        "and keeps the one that sends fewer bytes (docs/throughput.md); a float64 rerun takes its float32 run's",
        DISTRIBUTE,
        choices=SHARDED_FORWARDS,
    )
    trainer_process: str = option(
        "auto",
        "own: DTensor and MirroredStrategy train in a process of their own, with the intra-op threads that serve "
        "them (1 on logical CPUs), and on CPUs the reference's runs with 1 too, so that it rounds as each device "
        "does (its timing rounds stay here, with TensorFlow's default threads; not with --clients); a crash there "
        "fails only that trainer; shared: everything in this process (default: auto, own on CPUs and shared on GPUs)",
        DISTRIBUTE,
        choices=("auto", "own", "shared"),
    )
    mirrored_update: str = option(
        "auto",
        "MirroredStrategy's optimizer step: once on the first device with the weights copied to the "
        "replicas, or on every replica after an all-reduce (auto: primary in one process, replicas "
        "with --clients)",
        DISTRIBUTE,
        choices=("auto", "primary", "replicas"),
    )

    tolerance: Optional[float] = option(
        None,
        "parity bound in the run's dtype: |a - b| <= T + T |b| for every step's loss and the first "
        "step's gradients, 10 T for the final weights (default: measured per dtype, docs/parity.md)",
        PARITY,
        metavar="T",
        parse=float,
    )
    explain: bool = option(
        True,
        "when float32 parity fails, do not rerun the reference and the failing trainers in float64 "
        "to tell float noise from a real difference; the verdict is then MISMATCH "
        "(default: rerun, exit 0 for float noise)",
        PARITY,
        flag="--no-explain",
    )

    baseline: Optional[str] = option(
        None,
        "compare every trainer's losses and final weights with a report that --json wrote on another machine, "
        "release or commit: same, float noise or CHANGED (exit 1); a report of a run with other numeric "
        "options is refused, exit 2 (default: none)",
        REPRODUCIBILITY,
        metavar="REPORT.json",
    )
    with_float64: bool = option(
        False,
        "also train every trainer in float64 and write it into --json's report, so that a later --baseline "
        "against it can tell float32 noise from a change; about doubles the training time",
        REPRODUCIBILITY,
    )
    repeat: int = option(
        1,
        "train each trainer N times from the same start; report whether the runs are bitwise identical",
        REPRODUCIBILITY,
        metavar="N",
        parse=int,
    )
    deterministic: bool = option(  # docs/reproducibility.md
        False,
        "tf.config.experimental.enable_op_determinism() for this process, before anything runs",
        REPRODUCIBILITY,
    )

    json: Optional[str] = option(
        None, "write the JSON report here, atomically (default: none)", OUTPUTS, metavar="PATH"
    )
    plots: Optional[str] = option(
        None,
        "write loss.png, accuracy.png, loss_diff.png, throughput.png (and with --profile step_profile.png) here, "
        "made if missing (default: none)",
        OUTPUTS,
        metavar="DIR",
    )
    logdir: Optional[str] = option(
        None, "write TensorBoard scalars per trainer here (default: none)", OUTPUTS, metavar="DIR"
    )

    sweep_devices: Optional[Tuple[int, ...]] = option(
        None,
        "also measure throughput, parity and memory per device at each device count, e.g. 1,2,4,8; "
        "each configuration judged against the run's reference and timed beside it (default: none)",
        SPEED,
        metavar="N,N,...",
        parse=int_list,
    )
    profile: bool = option(
        False,
        "after training, trace each trainer's steady train call with TensorFlow's profiler: a step's forward, "
        "backward, collectives, update, input and other time, and the bytes its collectives send per device "
        "(a few seconds per trainer; docs/throughput.md)",
        SPEED,
    )
    link_gbps: Optional[float] = option(
        None,
        "with --profile, the least time those bytes take per step over links of G gigabits per second, e.g. "
        "your NVLink's or network's (default: none)",
        SPEED,
        metavar="G",
        parse=float,
    )
    device_memory_mb: Optional[float] = option(
        None,
        "with --sweep-devices: name the configurations whose weights and optimizer state fit in MB per "
        "device (default: none)",
        SPEED,
        metavar="MB",
        parse=float,
    )
    timing: bool = option(
        True,
        "after training, do not time each trainer's steady train call in rounds beside the reference's; the speed "
        "figures then come from the epochs after the first, and a sweep's ratios from fewer steps (default: time "
        "them, a few seconds per trainer; docs/throughput.md)",
        SPEED,
        flag="--no-timing",
    )
    sweep_meshes: str = option(
        "all",
        "all: DTensor on every batch x model mesh of each count and MirroredStrategy in each update "
        "mode; batch: DTensor on batch=N and MirroredStrategy's --mirrored-update only",
        SPEED,
        choices=("all", "batch"),
    )

    checkpoint_dir: Optional[str] = option(  # each epoch's directory is complete or absent
        None,
        "after every epoch write each trainer's full state to DIR/<trainer>/epoch-NNNN, e.g. epoch-0001 "
        "(default: none)",
        CHECKPOINTS,
        metavar="DIR",
    )
    keep_checkpoints: int = option(
        3,
        "with --checkpoint-dir, keep each trainer's newest N epochs and delete older ones; 0 keeps all",
        CHECKPOINTS,
        metavar="N",
        parse=int,
    )
    restore: Optional[str] = option(
        None,
        "start the trainers from a checkpoint any trainer wrote: DIR/<trainer>/epoch-NNNN, or DIR/<trainer> "
        "for its newest; --epochs stays the total (default: none)",
        CHECKPOINTS,
        metavar="PATH",
    )
    reference_from_scratch: bool = option(
        False,
        "with --restore: train the reference from the initial values for every epoch instead, and judge "
        "parity on the steps after the restore point: the resumed trainers against an uninterrupted run",
        CHECKPOINTS,
    )
    export: Optional[str] = option(
        None,
        "write each trainer's model as a SavedModel to DIR/<trainer>, servable without mesh or "
        "strategy (default: none)",
        CHECKPOINTS,
        metavar="DIR",
    )

    quiet: bool = option(False, "no per-epoch lines: the run's facts and the tables only", PRINTED)
    verbose: bool = option(
        False,
        "also show TensorFlow's own log lines (start-up, per-trace); hidden unless TF_CPP_MIN_LOG_LEVEL is set",
        PRINTED,
    )

    def __post_init__(self):
        if self.fit and self.trainers == TRAINER_NAMES:  # --fit's default trainers: Keras has no DTensor model.fit
            object.__setattr__(self, "trainers", FIT_TRAINERS)
        check(self)

    @property
    def weight_dtype(self) -> str:
        """The dtype of the weights, optimizer state and losses: float32 under a mixed policy."""
        return "float32" if self.dtype in MIXED_COMPUTE else self.dtype

    @property
    def compute_dtype(self) -> str:
        """The dtype the forward and backward compute in."""
        return MIXED_COMPUTE.get(self.dtype, self.dtype)

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


# The fields with a fixed set of values: --help lists them as the metavar, check() refuses any other.
CHOICES = {
    field.name: field.metadata["choices"] for field in dataclasses.fields(Config) if field.metadata.get("choices")
}


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def option_flag(field: str) -> str:
    """The flag compare.py gives field `field`: its own (--no-timing for `timing`), else flag(field)."""
    return _field(field).metadata.get("flag") or flag(field)


def _field(name: str) -> dataclasses.Field:
    return next(field for field in dataclasses.fields(Config) if field.name == name)


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
    if config.epochs == 0:  # a run of no step would judge nothing and say PARITY OK
        fail("epochs", "0 trains nothing, so no step would be judged; use 1 or more")
    for field in ("learning_rate", "clip_global_norm", "tolerance", "link_gbps", "device_memory_mb"):
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
    if config.device_memory_mb is not None and not config.sweep_devices:
        raise UsageError("--device-memory-mb names the sweep's configurations that fit; add --sweep-devices")
    if config.link_gbps and not config.profile:
        raise UsageError("--link-gbps turns the bytes that --profile counts into time; add --profile")
    if not 0 <= config.dropout < 1:
        raise UsageError(f"--dropout {config.dropout}: a rate is at least 0 and below 1, e.g. 0.1")
    if config.dropout and config.model not in BUILT_IN_MODELS:
        raise UsageError(
            f"--dropout sets the built-in models' dropout; your model ({config.model}) calls context.dropout in its "
            f"forward itself (docs/models.md): drop --dropout"
        )
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
        if config.trainer_process == "own":
            raise UsageError(
                "--trainer-process own: with --clients each client is a process of its own and trains its trainers "
                "there; drop it"
            )
        files = [flag(field) for field in ("checkpoint_dir", "restore", "export") if getattr(config, field)]
        if files:
            raise UsageError(
                f"{', '.join(files)} with --clients {config.clients} is not supported yet; use --clients 1"
            )
