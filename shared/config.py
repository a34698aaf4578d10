"""The run configuration: one frozen dataclass that argparse fills.

Nothing else in the project reads command-line flags; trainers, data loading and
the comparison take a `Config` (nanoGPT's GPTConfig is the model).
"""
import dataclasses
from typing import Optional, Tuple

TRAINER_NAMES = ("reference", "dtensor", "mirrored")
DTYPES = ("float32", "float64")  # --dtype: the tf/numpy dtype names of the weights, slots, losses and inputs
# The options that change the numbers a run computes: a --baseline report must have the same (shared/baseline.py),
# and the same data (its sha256). Devices, mesh, clients, --dtensor-input, --mirrored-update and --deterministic
# change only which kernels run and the order of roundings, which is what the comparison judges; they may differ.
NUMERIC_OPTIONS = ("model", "epochs", "batch_size", "learning_rate", "seed", "optimizer", "adam", "dtype", "hidden",
                   "shuffle", "restore")


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
    optimizer: str = "adam"  # "adam" or "sgd"; SGD exposes gradient-scale bugs that Adam hides
    adam: str = "fixed"  # "tutorial" keeps the tutorial's read-after-assign and frozen step count
    data: str = "auto"  # "auto", "tfds", "embedded" or a directory of MNIST IDX files
    train_examples: Optional[int] = None  # None: the source's default (tfds/IDX 5000, embedded 4000)
    test_examples: Optional[int] = None  # None: the source's default (tfds/IDX 5000, embedded 1000)
    model: str = "mlp"  # "mlp", "vit", or FILE.py:FUNCTION returning a ModelDefinition (shared/models.py)
    hidden: Optional[Tuple[int, ...]] = None  # the MLP's hidden layer sizes; None: the tutorial's 700,500
    shuffle: bool = False  # the tutorial does not shuffle; True reshuffles every epoch from `seed`
    dtensor_input: str = "pack"  # "pack" (tutorial: split + dtensor.pack) or "dataset" (DTensorDataset)
    mirrored_update: str = "auto"  # "primary", "replicas", or auto: primary in one process, replicas with --clients
    # float64 starts from the float32 initial values, widened: the same model from the same start, with
    # rounding ~1e9 times smaller, so parity can be judged on every step of any run (docs/parity.md).
    dtype: str = "float32"
    tolerance: Optional[float] = None  # atol and rtol of loss and gradients; weights get 10x. None: shared.parity's
    explain: bool = True  # on a float32 parity failure, rerun in float64 to tell float noise from a real difference
    # Also train every trainer in float64 and keep it in the report, so that a later --baseline against this
    # report can tell float32 noise from a change (shared/baseline.py); about doubles the training time.
    with_float64: bool = False
    repeat: int = 1  # train each trainer this many times from the same start; >1 reports reproducibility
    # tf.config.experimental.enable_op_determinism(), for the whole process, before any op runs (docs/reproducibility.md)
    deterministic: bool = False
    quiet: bool = False
    # After training, trace each trainer's steady train call: its step's parts and bytes per device (shared/profile.py).
    profile: bool = False
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

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)
