"""The trainer contract: what a trainer object gives the shared loop (`Trainer`), and what a trainer package
registers with the run (`TrainerSpec`, its `Cluster` for --clients). The registry (registry.py) holds one spec a
trainer; docs/trainers.md's tables are tested against both."""

import abc
import contextlib
import dataclasses
from typing import Callable, ContextManager, Dict, Iterable, List, Mapping, Optional, Protocol, Sequence, Tuple

import numpy as np

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.measure.history import History
from dtensor_vs_mirrored.shared.measure.profile import StepCall
from dtensor_vs_mirrored.shared.measure.taps import Taps
from dtensor_vs_mirrored.shared.measure.traffic import Implementation, Traffic
from dtensor_vs_mirrored.shared.model.definition import Caution

# What every trainer object must set in its __init__: a trainer that leaves one out cannot be made.
ATTRIBUTES = ("name", "placement", "details", "collectives", "model", "optimizer", "checkpointed")


class _Checked(abc.ABCMeta):
    def __call__(cls, *args, **kwargs):
        trainer = super().__call__(*args, **kwargs)
        missing = [name for name in ATTRIBUTES if not hasattr(trainer, name)]
        if missing:
            raise TypeError(f"{cls.__name__} sets no {', '.join(missing)} (shared.training.protocol.Trainer)")
        return trainer


class Trainer(metaclass=_Checked):
    """The parts shared/training/loop.py's `fit` calls: what distributing changes, nothing else. The step's
    arithmetic they share is shared/training/step.py's."""

    name: str  # "reference", "dtensor", "mirrored": the tables' row and the checkpoint directory
    placement: str  # e.g. "mesh batch=8 over 8 x CPU", for the results table
    details: Dict[str, str]  # facts for the JSON report, e.g. the mesh and layouts
    collectives: Implementation  # what its collectives run with, and why
    model: object  # a shared.model.Model on the trainer's devices
    optimizer: object  # its Adam or SGD
    checkpointed: Tuple[object, object]  # (model, optimizer) as checkpoints hold them: unpadded
    # True where the run's first train call also returns that step's gradients: the loop then takes them
    # (first_call_gradients) as the first-step gradients, the ones the step applied, instead of calling `gradients`
    # before training, a function of its own to trace (docs/throughput.md).
    steps_give_gradients: bool = False
    # Seconds it spent before training tracing and running steps whose traces the run's calls reuse (DTensor's
    # sharded forward, traced both ways: DTensorTrainer.choose_forward); the loop adds them to the trace time.
    probed_seconds: float = 0.0

    @abc.abstractmethod
    def gradients(self, x: np.ndarray, y: np.ndarray) -> List[np.ndarray]:
        """The gradients of the global mean loss on the global batch x, y at the current weights, unpadded arrays."""

    first_grads = None  # with steps_give_gradients: what the run's first train call returned (train_epoch keeps it)

    def first_call_gradients(self) -> List[np.ndarray]:
        """With `steps_give_gradients`: the gradients the run's first train call returned, unpadded arrays, read
        back after its epoch (not in its timed calls), then let go."""
        if not self.steps_give_gradients:
            raise NotImplementedError(f"{self.name}'s steps do not give their gradients")
        grads, self.first_grads = self.first_grads, None
        return self.host_gradients(grads)

    def host_gradients(self, grads) -> List[np.ndarray]:
        """Gradients as its steps return them, as unpadded host arrays (`gradients` and `first_call_gradients`)."""
        raise NotImplementedError(f"{self.name} reads no gradients back from its steps")

    @abc.abstractmethod
    def taps(self, x: np.ndarray, y: np.ndarray) -> Taps:
        """The forward's tapped values and their gradients on the global batch x, y at the current state, in float64
        runs' replay of a mismatching step (no update)."""

    @abc.abstractmethod
    def step(self, x: np.ndarray, y: np.ndarray) -> None:
        """One optimizer step on the global batch x, y (the replay trains the reference up to a step with it)."""

    @abc.abstractmethod
    def train_epoch(self, epoch: int, meter, first: bool, record_state: bool) -> None:
        """Every step of one epoch, each added to `meter`; the run's first call (`first`) is one step that
        waits for its loss, so that its time is the trace time (and with `steps_give_gradients`, keeps its
        gradients for `first_call_gradients()`)."""

    @abc.abstractmethod
    def trace_count(self) -> int:
        """Train-step traces so far: a measured epoch must add none."""

    @abc.abstractmethod
    def step_call(self, most_steps: int = 0) -> StepCall:
        """--profile and the bytes per step: the steady train call a measured epoch makes. With `most_steps` (the
        timing rounds'), a trainer whose one trace runs any number of steps a call makes its call of at most that
        many: a round then runs the steps it needs, not a whole epoch (a slow model's reference: seconds a round)."""

    @abc.abstractmethod
    def test_batches(self, x: np.ndarray, y: np.ndarray) -> Iterable:
        """The split x, y as `test_step`'s inputs, one global batch each, in order."""

    @abc.abstractmethod
    def test_step(self, batch) -> Tuple[object, object]:
        """(summed loss, correct count) of one of `test_batches`; the loop adds them up (step.evaluate)."""

    @abc.abstractmethod
    def state(self) -> list:
        """The variables whose checksums float64 runs record: weights, then the optimizer's slots."""

    @abc.abstractmethod
    def final_weights(self) -> List[np.ndarray]:
        """The weights as unpadded arrays."""

    @abc.abstractmethod
    def predict_logits(self, x: np.ndarray) -> np.ndarray:
        """The trainer's own logits for host inputs, which --export checks its SavedModel against."""

    def per_device(self, variables: Iterable) -> list:
        """Each variable's per-device values, for the memory tally (step.memory_per_device): one device, itself."""
        return list(variables)

    def held_variables(self) -> Tuple[list, list]:
        """(weights, optimizer state) that the trainer holds, whose bytes the memory tally counts."""
        return list(self.model.weights), list(self.optimizer.variables)

    def begin(self, start_epoch: int) -> None:
        """After --restore (or none) and before the first step."""

    def before_save(self) -> None:
        """Before each checkpoint."""

    def finish(self, history: History) -> None:
        """After the last epoch: facts only the trainer knows, into history.details."""


@dataclasses.dataclass(frozen=True)
class RunControl:
    """Run plumbing that is no user's option: what the run layer asks of one training besides its Config."""

    # The first-difference replay (shared/run/replay.py): record the taps of this step (0-based) from --restore's
    # state (which may be mid-epoch), or the initial one, and train nothing...
    replay_step: Optional[int] = None
    # ...or, given a directory, train the steps before it first and write the state there (the reference's side).
    replay_state: Optional[str] = None
    # Keep the trained trainer for timing after its run (shared/run/timing.py times it beside the reference).
    keep: bool = False
    # Evaluate on the test set after each epoch; the sweep's configurations do not (no figure of theirs uses it, and
    # the evaluation's trace and its passes cost each configuration seconds).
    evaluate: bool = True
    # A progress bar on a terminal; not the reference's while the lanes train beside it (shared/run/lanes.py): the
    # first lane's trainer process draws one, and two would overwrite each other.
    progress_bar: bool = True


PLAIN_RUN = RunControl()  # a training run as its Config describes it


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
    # How long it trains against the trainer's plain configuration, roughly (a scheduling hint, no figure): the
    # sweep trains its configurations two at a time, the costliest first (shared/run/sweep.py, Blocks).
    cost: float = 1.0


@dataclasses.dataclass(frozen=True)
class ClusterRole:
    """This process's place in a --clients cluster, as the environment describes it."""

    client_id: int
    num_clients: int
    source: str  # the variable that said so, for messages
    address: str  # this client's host:port
    addresses_in: str  # the variable that lists every client's address, for messages


@dataclasses.dataclass(frozen=True)
class Cluster:
    """How a trainer runs as --clients processes: the variables that make a process one of its clients."""

    variables: Tuple[str, ...]  # the environment variables that make a process one of its clients
    role: Callable[[Config, Mapping[str, str]], Optional[ClusterRole]]  # None when none is set; UsageError if wrong
    environment: Callable[[int, Sequence[str]], Dict[str, str]]  # (client id, every client's address) -> variables
    join: Callable[[Config], None]  # join the cluster before anything else starts TensorFlow's runtime


def _nothing(*args) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class TrainerSpec:
    """What a trainer package registers (shared/training/registry.py): the run reaches a trainer only through it."""

    name: str  # "dtensor": --trainers' name, the tables' row
    trainer: Callable[..., Trainer]  # (config, data, devices, log) -> the Trainer that loop.fit trains
    # (config, devices) -> None, or UsageError (one line) for a configuration it cannot run, before anything trains
    check_config: Callable[[Config, Sequence[str]], None] = _nothing
    # (config, device count, every layout?, the API's meshes) -> its configurations: the sweep's, the API's
    variants: Callable[[Config, int, bool, Sequence[str]], List[Variant]] = lambda *args: []
    # The environment its trainer process starts with (e.g. TF_NUM_INTRAOP_THREADS); {}: none asked for.
    process_environment: Callable[[Config], Dict[str, str]] = lambda config: {}
    before_runtime: Callable[[Config, int], None] = _nothing  # what must be fixed before TensorFlow's runtime starts
    describe_run: Callable[[Config], RunFacts] = lambda config: RunFacts()  # the header's facts
    cluster: Optional[Cluster] = None  # None: it never runs as --clients processes
    # (trainer) -> (bytes per step, "") or (None, why): counted in the functions its steady call ran
    count_bytes: Callable[[Trainer], Tuple[Optional[Traffic], str]] = lambda trainer: (None, "not counted")
    # (devices) -> what the trainer is made and trained under: the reference's device; nothing for the others
    scope: Callable[[Sequence[str]], ContextManager] = lambda devices: contextlib.nullcontext()
    distributes: bool = True  # False for the reference: the ground truth, trained beside every other
    # --fit: the Trainer that trains the user's Keras model with Keras's own model.fit in this trainer's place (the
    # reference's on one device, mirrored's under MirroredStrategy); None: it has none, and --fit refuses it.
    fit_trainer: Optional[Callable[..., Trainer]] = None
    # (config, training examples) -> what makes its fit_trainer compute otherwise than one device's model.fit, known
    # before it trains (the header's and the report's cautions); (): nothing.
    fit_cautions: Callable[[Config, int], Tuple[Caution, ...]] = lambda config, train_examples: ()
    # Config fields only this trainer reads -> what they do, e.g. {"shard_weights": "lays out DTensor's weights"}:
    # set without this trainer chosen, one line says so (shared/run/comparison.py).
    options: Dict[str, str] = dataclasses.field(default_factory=dict)
    # (config, its float32 run's history) -> its float64 rerun's config, with what that run chose pinned (DTensor's
    # forward of weights split on the batch axis), so that the rerun computes the program it explains
    pinned: Callable[[Config, History], Config] = lambda config, history: config


class Progress(Protocol):
    """What the loop and a trainer tell as they train; shared/report/progress.py prints it, `Silent` does not."""

    def line(self, text: str) -> None:
        """A line of its own: the trainer's placement, a checkpoint written."""

    def epoch_started(self, label: str, steps: int) -> None:
        """An epoch of `steps` steps begins (a progress bar, on a terminal)."""

    def steps_done(self, count: int) -> None:
        """`count` more steps of the epoch have run."""

    def epoch_done(self, trainer: str, record, epochs: int) -> None:
        """The epoch's record (shared.measure.history.EpochRecord): the epoch line."""


class Silent:
    """A Progress that tells nothing."""

    def line(self, text: str) -> None:
        pass

    def epoch_started(self, label: str, steps: int) -> None:
        pass

    def steps_done(self, count: int) -> None:
        pass

    def epoch_done(self, trainer: str, record, epochs: int) -> None:
        pass
