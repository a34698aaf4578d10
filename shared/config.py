"""The run's whole configuration: one frozen dataclass of the user's options, each value checked when it is made.

Each field declares its compare.py option once (Group.option, shared/option.py), and compare.py makes its parser from
them; the Python API (shared/api.py) and the --clients launcher make a Config directly. A rule between options lives
with the part of the run that owns it (shared/run/run_options.py), a trainer's beside its spec (training/registry.py).
"""

import dataclasses
import json
from typing import Optional, Tuple

from dtensor_vs_mirrored.shared.errors import flag
from dtensor_vs_mirrored.shared.option import COUNT, COUNTS, EPOCHS, NATURAL, POSITIVE, Group, check_values, name_list

# --help's groups; the fields' order is their order, and the options' order within each.
WHERE = Group("what trains where")
MODEL = Group("the model")
RUN = Group("the training run (the same for every trainer)")
DATA = Group("data")
DISTRIBUTE = Group("how each approach distributes")
PARITY = Group("parity")
REPRODUCIBILITY = Group("reproducibility and baselines")
OUTPUTS = Group("outputs")
SPEED = Group("speed")
CHECKPOINTS = Group("checkpoints and export")
PRINTED = Group("what is printed")

# The built-in models (shared/model/registry.py): named here, at the bottom, where every layer can read them.
BUILT_IN_MODELS = ("mlp", "vit", "gpt")
SHARDED_FORWARDS = ("auto", "gather", "expand")  # --sharded-forward: DTensor's forward of batch-split weights
TUTORIAL_HIDDEN = (700, 500)  # the MLP's hidden layers, --hidden's default (None)
# --dtype's mixed policies -> the forward's and backward's dtype; weights, slots and the loss stay float32 (parity.md)
MIXED_COMPUTE = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


@dataclasses.dataclass(frozen=True)
class Config:
    # None: the registry's, or under --fit those with a model.fit (registry.chosen); compare.py fills in {trainers}
    trainers: Optional[Tuple[str, ...]] = WHERE.option(
        None, "comma-separated trainers to run: {trainers} (default: {trainers})", parse=name_list
    )
    devices: int = WHERE.option(8, "logical devices (per client)", kind=COUNT)  # 8 virtual CPUs, as in the tutorial
    clients: int = WHERE.option(
        1,
        "processes, each with --devices logical devices: DTensor multi-client and "
        "MultiWorkerMirroredStrategy; started here on loopback ports unless the environment names "
        "this process's cluster (DTENSOR_CLIENT_ID.. or TF_CONFIG; docs/multi-machine.md)",
        kind=COUNT,
    )
    device_type: str = WHERE.option(
        "CPU",
        "logical CPUs (one physical CPU split) or GPUs (one physical GPU split if needed)",
        parse=str.upper,
        choices=("CPU", "GPU"),
    )
    mesh: Optional[str] = WHERE.option(None, "DTensor mesh batch=B[,model=M] (default: batch=DEVICES)")
    # The loop most users run: model.fit, on one device and under MirroredStrategy (shared/training/keras_fit.py).
    fit: bool = WHERE.option(
        False,
        "train your Keras model (--model FILE.py:FUNCTION) with Keras's own model.fit and its own compile settings: "
        "on one device as the reference, under MirroredStrategy as mirrored (the default trainers then), judged "
        "step by step (docs/keras.md)",
    )
    model: str = MODEL.option(
        "mlp",
        "mlp (the tutorial's), vit (a small Vision Transformer), gpt (a character GPT on tiny Shakespeare), "
        "or FILE.py:FUNCTION returning a dtensor_vs_mirrored.shared.model.ModelDefinition (examples/my_model.py)",
    )
    hidden: Optional[Tuple[int, ...]] = MODEL.option(
        None, f"the MLP's hidden layer sizes (default: {','.join(map(str, TUTORIAL_HIDDEN))})", kind=COUNTS
    )
    dropout: float = MODEL.option(
        0.0,
        "the built-in models' dropout rate in training, drawn alike by every trainer (ForwardContext.dropout, "
        "docs/models.md); your model calls context.dropout itself (default: 0, none)",
        metavar="RATE",
        parse=float,
    )
    epochs: int = RUN.option(3, "passes over the training set", kind=EPOCHS)
    batch_size: int = RUN.option(128, "global batch size", kind=COUNT)  # one optimizer step's, over all devices
    learning_rate: float = RUN.option(1e-3, "Adam or SGD step size", kind=POSITIVE)
    seed: int = RUN.option(  # the tutorial's seed: its initial values use (22, 23)
        22, "initial values use stateless seed (SEED, SEED+1); also the --shuffle seed", kind=NATURAL
    )
    optimizer: str = RUN.option(
        "adam", "sgd exposes gradient-scale errors that Adam's normalisation hides", choices=("adam", "sgd")
    )
    adam: str = RUN.option(
        "fixed", "tutorial: the tutorial's Adam (read-after-assign, frozen step count)", choices=("fixed", "tutorial")
    )
    # Clipped where each trainer combines its gradients, before its optimizer: the global gradient's norm.
    clip_global_norm: Optional[float] = RUN.option(
        None,
        "clip the gradient to global norm X after it is combined across devices, on the reference, DTensor and "
        "MirroredStrategy alike (not with --fit: Keras's own clipnorm, global_clipnorm and clipvalue, set in "
        "compile, clip each replica's part of it; docs/keras.md) (default: none)",
        kind=POSITIVE("X"),
    )
    # float64: the same run, rounding ~1e9 times smaller, so that parity is judged on every step of any run
    dtype: str = RUN.option(
        "float32",
        "of weights, Adam slots and losses; float64 starts from the float32 initial values widened, "
        "and its parity is judged on every step with far tighter tolerances; mixed_bfloat16 and mixed_float16 "
        "compute the forward and backward in bfloat16 or float16 from float32 weights, mixed_float16 with "
        "dynamic loss scaling (docs/parity.md)",
        choices=("float32", "float64", *MIXED_COMPUTE),
    )
    shuffle: bool = RUN.option(False, "reshuffle the training set every epoch from --seed")  # the tutorial does not
    data: str = DATA.option(
        "auto",
        "auto, tfds, embedded (the model's own data: MNIST, tiny Shakespeare), a directory of MNIST IDX "
        "files, or FILE.npz of your arrays x_train, y_train, x_test, y_test",
    )
    train_examples: Optional[int] = DATA.option(
        None, "training examples (default: tfds/IDX 5000, embedded 4000)", kind=COUNT
    )
    test_examples: Optional[int] = DATA.option(
        None, "test examples (default: tfds/IDX 5000, embedded 1000)", kind=COUNT
    )
    dtensor_input: str = DISTRIBUTE.option(
        "pack", "DTensor input: split + dtensor.pack per batch, or dtensor.DTensorDataset", choices=("pack", "dataset")
    )
    dtensor_nccl: bool = DISTRIBUTE.option(
        True,
        "on GPUs, leave DTensor's collectives on TensorFlow's ring instead of NCCL (DTensor's own default; "
        "default: NCCL wherever TensorFlow allows it, one physical GPU per device; CPUs have no NCCL)",
        flag="--no-dtensor-nccl",
    )
    shard_weights: bool = DISTRIBUTE.option(
        False,
        "DTensor: also split every weight and its optimizer slots over the batch axis (sharded data "
        "parallel, as FSDP and ZeRO-3), on a dimension the batch axis divides; what cannot be split "
        "stays replicated and is named (docs/approaches.md)",
    )
    sharded_forward: str = DISTRIBUTE.option(
        "auto",
        "DTensor, weights split on the batch axis (--shard-weights, the sweep's sharded meshes): gather all-gathers "
        "them for the forward (FSDP's), expand leaves them to DTensor's SPMD expansion, auto traces a step each way "
        "and keeps the one that sends fewer bytes (docs/throughput.md); a float64 rerun takes its float32 run's",
        choices=SHARDED_FORWARDS,
    )
    trainer_process: str = DISTRIBUTE.option(
        "auto",
        "own: DTensor and MirroredStrategy train in a process of their own, with the intra-op threads that serve "
        "them (1 on logical CPUs), and on CPUs the reference's runs with 1 too, so that it rounds as each device "
        "does (its timing rounds stay here, with TensorFlow's default threads; not with --clients); a crash there "
        "fails only that trainer; shared: everything in this process (default: auto, own on CPUs and shared on GPUs)",
        choices=("auto", "own", "shared"),
    )
    mirrored_update: str = DISTRIBUTE.option(
        "auto",
        "MirroredStrategy's optimizer step: once on the first device with the weights copied to the "
        "replicas, or on every replica after an all-reduce (auto: primary in one process, replicas "
        "with --clients)",
        choices=("auto", "primary", "replicas"),
    )
    tolerance: Optional[float] = PARITY.option(
        None,
        "parity bound in the run's dtype: |a - b| <= T + T |b| for every step's loss and the first "
        "step's gradients, 10 T for the final weights (default: measured per dtype, docs/parity.md)",
        kind=POSITIVE("T"),
    )
    explain: bool = PARITY.option(
        True,
        "when float32 parity fails, do not rerun the reference and the failing trainers in float64 "
        "to tell float noise from a real difference; the verdict is then MISMATCH "
        "(default: rerun, exit 0 for float noise)",
        flag="--no-explain",
    )
    baseline: Optional[str] = REPRODUCIBILITY.option(
        None,
        "compare every trainer's losses and final weights with a report that --json wrote on another machine, "
        "release or commit: same, float noise or CHANGED (exit 1); a report of a run with other numeric "
        "options is refused, exit 2 (default: none)",
        metavar="REPORT.json",
    )
    with_float64: bool = REPRODUCIBILITY.option(
        False,
        "also train every trainer in float64 and write it into --json's report, so that a later --baseline "
        "against it can tell float32 noise from a change; about doubles the training time",
    )
    repeat: int = REPRODUCIBILITY.option(
        1,
        "train each trainer N times from the same start; report whether the runs are bitwise identical",
        kind=COUNT("N"),
    )
    deterministic: bool = REPRODUCIBILITY.option(  # docs/reproducibility.md
        False, "tf.config.experimental.enable_op_determinism() for this process, before anything runs"
    )
    json: Optional[str] = OUTPUTS.option(None, "write the JSON report here, atomically (default: none)", metavar="PATH")
    plots: Optional[str] = OUTPUTS.option(
        None,
        "write loss.png, accuracy.png, loss_diff.png, throughput.png (and with --profile step_profile.png) here, "
        "made if missing (default: none)",
        metavar="DIR",
    )
    logdir: Optional[str] = OUTPUTS.option(
        None, "write TensorBoard scalars per trainer here (default: none)", metavar="DIR"
    )
    sweep_devices: Optional[Tuple[int, ...]] = SPEED.option(
        None,
        "also measure throughput, parity and memory per device at each device count, e.g. 1,2,4,8; "
        "each configuration judged against the run's reference and timed beside it (default: none)",
        kind=COUNTS("N,N,..."),
    )
    profile: bool = SPEED.option(
        False,
        "after training, trace each trainer's steady train call with TensorFlow's profiler: a step's forward, "
        "backward, collectives, update, input and other time, and the bytes its collectives send per device "
        "(a few seconds per trainer; docs/throughput.md)",
    )
    link_gbps: Optional[float] = SPEED.option(
        None,
        "with --profile, the least time those bytes take per step over links of G gigabits per second, e.g. "
        "your NVLink's or network's (default: none)",
        kind=POSITIVE("G"),
    )
    device_memory_mb: Optional[float] = SPEED.option(
        None,
        "with --sweep-devices: name the configurations whose weights and optimizer state fit in MB per "
        "device (default: none)",
        kind=POSITIVE("MB"),
    )
    timing: bool = SPEED.option(
        True,
        "after training, do not time each trainer's steady train call in rounds beside the reference's; the speed "
        "figures then come from the epochs after the first, and a sweep's ratios from fewer steps (default: time "
        "them, a few seconds per trainer; docs/throughput.md)",
        flag="--no-timing",
    )
    sweep_meshes: str = SPEED.option(
        "all",
        "all: DTensor on every batch x model mesh of each count and MirroredStrategy in each update "
        "mode; batch: DTensor on batch=N and MirroredStrategy's --mirrored-update only",
        choices=("all", "batch"),
    )

    checkpoint_dir: Optional[str] = CHECKPOINTS.option(  # each epoch's directory is complete or absent
        None,
        "after every epoch write each trainer's full state to DIR/<trainer>/epoch-NNNN, e.g. epoch-0001 "
        "(default: none)",
        metavar="DIR",
    )
    keep_checkpoints: int = CHECKPOINTS.option(
        3,
        "with --checkpoint-dir, keep each trainer's newest N epochs and delete older ones; 0 keeps all",
        kind=NATURAL("N"),
    )
    restore: Optional[str] = CHECKPOINTS.option(
        None,
        "start the trainers from a checkpoint any trainer wrote: DIR/<trainer>/epoch-NNNN, or DIR/<trainer> "
        "for its newest; --epochs stays the total (default: none)",
        metavar="PATH",
    )
    reference_from_scratch: bool = CHECKPOINTS.option(
        False,
        "with --restore: train the reference from the initial values for every epoch instead, and judge "
        "parity on the steps after the restore point: the resumed trainers against an uninterrupted run",
    )
    export: Optional[str] = CHECKPOINTS.option(
        None,
        "write each trainer's model as a SavedModel to DIR/<trainer>, servable without mesh or "
        "strategy (default: none)",
        metavar="DIR",
    )
    quiet: bool = PRINTED.option(False, "no per-epoch lines: the run's facts and the tables only")
    verbose: bool = PRINTED.option(
        False, "also show TensorFlow's own log lines (start-up, per-trace); hidden unless TF_CPP_MIN_LOG_LEVEL is set"
    )

    def __post_init__(self):
        check_values(self)

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


# The fields with a fixed set of values: --help lists them as the metavar, Config refuses any other.
CHOICES = {
    field.name: field.metadata["choices"] for field in dataclasses.fields(Config) if field.metadata.get("choices")
}


def option_flag(field: str) -> str:
    """The flag compare.py gives field `field`: its own (--no-timing for `timing`), else flag(field)."""
    return {declared.name: declared for declared in dataclasses.fields(Config)}[field].metadata["flag"] or flag(field)
