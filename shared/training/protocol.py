"""The trainer contract: what a trainer object gives the shared loop (`Trainer`), and what a trainer module
gives the run (`TrainerModule`). The reference, dtensor_impl and mirrored_impl supply every part; the
registry (registry.py) checks each module against `TrainerModule`, and docs/trainers.md's tables are
tested against both."""

import abc
import dataclasses
from typing import Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple, runtime_checkable

import numpy as np

from shared.config import Config
from shared.measure.history import History
from shared.measure.memory import DeviceMemory
from shared.measure.profile import StepCall
from shared.measure.taps import Taps
from shared.measure.traffic import Implementation


class Trainer(abc.ABC):
    """The parts shared/training/loop.py's `fit` calls: what distributing changes, nothing else."""

    name: str  # "reference", "dtensor", "mirrored": the tables' row and the checkpoint directory
    placement: str  # e.g. "mesh batch=8 over 8 x CPU", for the results table
    details: Dict[str, str]  # facts for the JSON report, e.g. the mesh and layouts
    collectives: Implementation  # what its collectives run with, and why
    model: object  # a shared.model.Model on the trainer's devices
    optimizer: object  # its Adam or SGD
    checkpointed: Tuple[object, object]  # (model, optimizer) as checkpoints hold them: unpadded

    @abc.abstractmethod
    def gradients(self, x: np.ndarray, y: np.ndarray) -> List[np.ndarray]:
        """The first step's gradients of the global mean loss at the current weights, unpadded arrays."""

    @abc.abstractmethod
    def taps(self, x: np.ndarray, y: np.ndarray) -> Taps:
        """The forward's tapped values and their gradients on the global batch x, y at the current state, in float64
        runs' replay of a mismatching step (no update)."""

    @abc.abstractmethod
    def train_epoch(self, epoch: int, meter, first: bool, record_state: bool) -> None:
        """Every step of one epoch, each added to `meter`; the run's first call (`first`) is one step that
        waits for its loss, so that its time is the trace time."""

    @abc.abstractmethod
    def trace_count(self) -> int:
        """Train-step traces so far: a measured epoch must add none."""

    @abc.abstractmethod
    def step_call(self) -> StepCall:
        """--profile: the steady train call a measured epoch makes."""

    @abc.abstractmethod
    def evaluate(self, x: np.ndarray, y: np.ndarray) -> Tuple[float, float]:
        """(mean loss, accuracy) over a whole split."""

    @abc.abstractmethod
    def state(self) -> list:
        """The variables whose checksums float64 runs record: weights, then the optimizer's slots."""

    @abc.abstractmethod
    def final_weights(self) -> List[np.ndarray]:
        """The weights as unpadded arrays."""

    @abc.abstractmethod
    def memory_per_device(self) -> List[DeviceMemory]:
        """Bytes of weights and optimizer state on each device, from the live variables."""

    @abc.abstractmethod
    def predict_logits(self, x: np.ndarray) -> np.ndarray:
        """The trainer's own logits for host images, which --export checks its SavedModel against."""

    def begin(self, start_epoch: int) -> None:  # noqa: B027 - optional: overridden where needed
        """After --restore (or none) and before the first step."""

    def before_save(self) -> None:  # noqa: B027 - optional: overridden where needed
        """Before each checkpoint."""

    def finish(self, history: History) -> None:  # noqa: B027 - optional: overridden where needed
        """After the last epoch: facts only the trainer knows, into history.details."""


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What the header says of a trainer before anything trains."""

    devices: str = ""  # after the device list, e.g. "DTensor mesh batch=8"; "" for nothing
    per_replica_batch: str = ""  # e.g. "16 (DTensor)"; "" for a trainer without replicas


@dataclasses.dataclass(frozen=True)
class Variant:
    """One configuration of a trainer in the device sweep or the Python API, e.g. a DTensor mesh."""

    key: str  # how the API's results name it, e.g. "dtensor batch=2,model=4"
    config: Config  # the run's, with this variant's devices, mesh or update
    mesh: str = ""  # the sweep table's columns (the JSON's sweep entries keep each key)
    update: str = ""
    shard_weights: bool = False


@dataclasses.dataclass(frozen=True)
class ClusterRole:
    """This process's place in a --clients cluster, as the environment describes it."""

    client_id: int
    num_clients: int
    source: str  # the variable that said so, for messages
    address: str  # this client's host:port
    addresses_in: str  # the variable that lists every client's address, for messages


@runtime_checkable
class TrainerModule(Protocol):
    """What a trainer module offers the run (shared/run/), reached through the registry by name."""

    def fit(self, config: Config, data, devices: Sequence[str], log: Callable) -> History:
        """Train on exactly `devices` and return the history record."""

    def check_config(self, config: Config, devices: Sequence[str]) -> None:
        """Raise UsageError (one line) for a configuration it cannot run, before anything trains."""

    def before_runtime(self, config: Config, device_count: int) -> None:
        """What must be fixed before TensorFlow's runtime starts in this process."""

    def process_environment(self, config: Config) -> Dict[str, str]:
        """The environment its trainer process starts with (e.g. TF_NUM_INTRAOP_THREADS); the reference's is {}:
        it trains in the run's own process."""

    def describe_run(self, config: Config) -> RunFacts:
        """The header's facts."""

    def variants(self, config: Config, count: int, every_layout: bool, meshes: Sequence[str] = ()) -> List[Variant]:
        """Its configurations at `count` devices: every layout for the sweep, or the run's own (`meshes`: the
        API's DTensor meshes)."""

    def cluster_variables(self) -> Tuple[str, ...]:
        """The environment variables that make a process one of its --clients (none: it runs in one process)."""

    def cluster_role(self, config: Config, environ: Mapping[str, str]) -> Optional[ClusterRole]:
        """This process's role from `environ`; None when its variables are not set; UsageError when wrong."""

    def client_environment(self, client_id: int, addresses: Sequence[str]) -> Dict[str, str]:
        """The variables that make a process client `client_id` of len(addresses)."""

    def join_cluster(self, config: Config) -> None:
        """--clients: join the cluster before anything else starts TensorFlow's runtime."""
