"""What one run trains and how: its entries (the reference first), where, with which Train, timed or not, and what is
already trained. shared/run/sequence.py `train_and_judge` takes one RunPlan; its callers (compare.py's main run, each
configuration of the sweep, --clients, dtensor_vs_mirrored.shared.api.check_model) each say what differs in theirs."""

import dataclasses
from typing import Callable, List, Mapping, Optional, Sequence

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.console import print_fitted
from dtensor_vs_mirrored.shared.measure.timing import wanted as timed_run
from dtensor_vs_mirrored.shared.run.results import TrainerResult
from dtensor_vs_mirrored.shared.training.data import Dataset
from dtensor_vs_mirrored.shared.training.protocol import RunControl
from dtensor_vs_mirrored.shared.training.registry import chosen


@dataclasses.dataclass(frozen=True)
class Entry:
    """One trainer to train in a run: how the results name it, which trainer, with which configuration."""

    key: str  # "dtensor"; the Python API's "dtensor batch=2,model=4"
    trainer: str
    config: Config


# How one entry is trained with a given configuration (its own, or its float64 rerun's), and the run control
# (the replay's); an implementation takes the control as an optional third argument.
Train = Callable[..., TrainerResult]


def lineup(config: Config) -> List[Entry]:
    """The reference first (it is the ground truth), then each chosen trainer, each with the run's config."""
    names = ["reference"] + [name for name in chosen(config) if name != "reference"]
    return [Entry(name, name, config) for name in names]


def timed_control(config: Config, timed: bool, evaluate: bool = True) -> RunControl:
    """A run's control: its trainers kept for the timing rounds when it is timed (shared.measure.timing.wanted);
    `evaluate`: each epoch evaluated on the test set (not the sweep's configurations)."""
    return RunControl(keep=timed and timed_run(config), evaluate=evaluate)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunPlan:
    """One run to train and judge: `entries` (the reference first) on `devices`, each trained by `train`."""

    config: Config
    data: Dataset
    devices: Sequence[str]
    entries: Sequence[Entry]
    train: Train
    log: Callable[[str], None] = print_fitted
    # One trainer a lane at once (shared/run/lanes.py): the others' runs train there while the reference trains here.
    lanes: Sequence[Train] = ()
    # Kept for the timing rounds and timed beside the reference; time_later: kept untimed, for the sweep's first
    # block to time (shared/run/sweep.py Blocks.first).
    timed: bool = False
    time_later: bool = False
    evaluate: bool = True  # each epoch evaluated on the test set (not the sweep's configurations)
    # Already trained: the reference's run (the sweep's, the main run's) and others' (a sweep block's, kept when timed).
    reference_result: Optional[TrainerResult] = None
    trained: Mapping[str, TrainerResult] = dataclasses.field(default_factory=dict)
    no_float64_reason: str = ""  # why this caller cannot train float64 runs ("" when it can)
    saved_baseline: Optional[dict] = None  # --baseline's saved report

    @property
    def control(self) -> RunControl:
        return timed_control(self.config, self.timed, self.evaluate)

    @property
    def reference(self) -> Entry:
        return self.entries[0]

    @property
    def train_examples(self) -> int:
        return len(self.data.y_train)
