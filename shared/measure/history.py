"""The result record that every trainer's training returns, and the meter that fills it each epoch.

Values are recorded here, never printed (shared/report/progress.py prints the epoch line): compare.py builds
its tables, plots and JSON report from these records.
"""

import dataclasses
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dtensor_vs_mirrored.shared.measure.timing import Timing


@dataclasses.dataclass
class EpochRecord:
    epoch: int  # 1-based
    train_loss: float  # mean over the epoch's real training examples, at the weights each step saw
    train_accuracy: float
    test_loss: Optional[float]  # mean over the test examples after the epoch; None: not evaluated (RunControl)
    test_accuracy: Optional[float]
    train_seconds: float  # wall time of the epoch's training steps, tracing included in epoch 1
    traces: int = 0  # train-step functions traced during the epoch: 0 after the first, or its time is no measure


@dataclasses.dataclass
class History:
    trainer: str
    placement: str  # e.g. "1 x CPU", "mesh batch=8 over 8 x CPU", "8 replicas on CPU"
    step_losses: List[float] = dataclasses.field(default_factory=list)  # one per training step
    epochs: List[EpochRecord] = dataclasses.field(default_factory=list)
    step_times_ms: List[float] = dataclasses.field(default_factory=list)  # between step completions
    trace_seconds: float = 0.0  # first train_step and test_step calls: tracing, compiling and one run
    first_step_gradients: List[np.ndarray] = dataclasses.field(default_factory=list)  # at the initial weights
    final_weights: List[np.ndarray] = dataclasses.field(default_factory=list)  # [w0, b0, w1, b1, ...]
    # The name of each final_weights array, in order: the model's labels (ModelDefinition.labels).
    weight_names: List[str] = dataclasses.field(default_factory=list)
    details: Dict[str, str] = dataclasses.field(default_factory=dict)  # e.g. cross-device ops in use
    memory_per_device: list = dataclasses.field(
        default_factory=list
    )  # [shared.measure.memory.DeviceMemory], after training
    dtype: str = "float32"  # of the weights, slots and losses (--dtype), or the mixed policy
    skipped_steps: Optional[int] = None  # mixed_float16: steps its loss scaling skipped (non-finite gradient)
    # --fit under mixed_float16: the loss scale each step multiplied its loss by, and the steps Keras's
    # LossScaleOptimizer skipped (its iterations did not move); empty where not recorded per step.
    step_loss_scales: List[float] = dataclasses.field(default_factory=list)
    skipped_step_indices: List[int] = dataclasses.field(default_factory=list)
    # float64 runs only (shared/measure/checksums.py): [variables] float64 checksums of the training state
    # that each step starts from, then of the final state (steps + 1 entries), and what each row is.
    step_state_checksums: List[np.ndarray] = dataclasses.field(default_factory=list)
    state_names: List[str] = dataclasses.field(default_factory=list)
    state_sizes: List[int] = dataclasses.field(
        default_factory=list
    )  # elements of each, for shared.judge.parity.state_atol
    collectives: Optional[object] = None  # shared.measure.traffic.Implementation: what its collectives ran with
    # --profile (shared/measure/profile.py): the step's parts, its bytes per device (shared.measure.traffic.Traffic),
    # or why none
    step_profile: Optional[object] = None
    traffic: Optional[object] = None
    traffic_missing: str = ""
    taps: Optional[object] = None  # shared.measure.taps.Taps: a replay's (RunControl.replay_step), else None
    # Its steady call timed after the run (shared/run/timing.py), beside the reference's rounds; None: not timed,
    # and its speed is its measured epochs'.
    timing: Optional[Timing] = None

    def add_final_state(self, checksums) -> None:
        """The state checksums after the last step (float64 runs; shared/measure/checksums.py)."""
        self.step_state_checksums.append(_host_array(checksums))

    def add_epoch(
        self,
        epoch: int,
        meter: "EpochMeter",
        finished,
        test_loss: Optional[float],
        test_accuracy: Optional[float],
        traces: int = 0,
    ) -> EpochRecord:
        """Record epoch `epoch` (1-based) from `finished` = meter.finish(), the test metrics and the
        number of traces during its training steps."""
        step_losses, train_loss, train_accuracy, seconds = finished
        self.step_losses += step_losses
        self.step_state_checksums += [_host_array(step) for chunk in meter.state_checksums for step in chunk]
        self.step_times_ms += meter.step_times_ms
        record = EpochRecord(epoch, train_loss, train_accuracy, test_loss, test_accuracy, seconds, traces)
        self.epochs.append(record)
        return record


# The timing floor: an epoch of less training time than this gives no throughput figure (nor
# GFLOP/s). Timers resolve far finer; the floor is there because a few milliseconds of steps
# (a slice of the data, one epoch less its trace time) gave figures above the machine's matmul
# peak. 0.1 s is 2/3 of the reference's fastest epoch on the default data (4,000 examples at
# ~27,000 examples/s on 2 cores), so the default run keeps its figures.
MIN_MEASURED_SECONDS = 0.1


def measured_epochs(history) -> List[EpochRecord]:
    """The epochs whose time measures training: after the first (which traces), none traced, each
    at least MIN_MEASURED_SECONDS long. With --epochs 1 there are none."""
    return [
        record for record in history.epochs[1:] if record.traces == 0 and record.train_seconds >= MIN_MEASURED_SECONDS
    ]


def measured_steps(history) -> int:
    """The timed steps (shared/measure/timing.py), or without them the training steps of the measured epochs
    (every epoch has the same steps: shared.training.batches)."""
    if history.timing is not None:
        return history.timing.steps
    per_epoch = len(history.step_losses) // len(history.epochs) if history.epochs else 0
    return per_epoch * len(measured_epochs(history))


def throughput(history, train_examples: int) -> Optional[Tuple[float, float, float]]:
    """Training examples/s: (median, min, max) over the timed rounds (shared/measure/timing.py), or without them over
    the measured epochs; None when there is none."""
    if history.timing is not None:
        return history.timing.throughput()
    rates = [train_examples / record.train_seconds for record in measured_epochs(history)]
    if not rates:
        return None
    return float(np.median(rates)), float(min(rates)), float(max(rates))


def step_time_percentiles_ms(history) -> Optional[Tuple[float, float]]:
    """p50 and p95 of the timed calls' step times, or without them of the epochs after the first (which traces);
    None without either.

    Every epoch has the same steps (shared.training.batches.epoch_batches), so the first epoch's are the
    first len / epochs of them.
    """
    if history.timing is not None:
        p50, p95 = np.percentile(history.timing.step_times_ms(), [50, 95])
        return float(p50), float(p95)
    if len(history.epochs) < 2:
        return None
    first_epoch_steps = len(history.step_times_ms) // len(history.epochs)
    p50, p95 = np.percentile(history.step_times_ms[first_epoch_steps:] or [0.0], [50, 95])
    return float(p50), float(p95)


class EpochMeter:
    """Accumulates per-step tensors without a host sync; `finish` syncs once per epoch.

    `step_times_ms` holds the wall time between consecutive `add` calls, input
    preparation included (or from `step_begins` to `add`, where the trainer marks its
    steps' starts). They are step times only if each call has finished its steps when
    the trainer adds them: a DTensor call of several steps can return earlier, so that
    trainer waits for the call's last loss first.
    """

    def __init__(self, on_steps: Callable[[int], None] = lambda count: None):
        self.losses, self.corrects, self.counts, self.step_times_ms = [], [], [], []
        self.call_seconds = []  # the wall time of each add: a trainer's call of one or more steps
        self.state_checksums = []  # per call: [steps] of [variables], each at a step's start (float64 runs)
        self.start = self._last = time.perf_counter()
        self.on_steps = on_steps  # told each call's step count (the progress bar)
        self.steps_only = False  # step_begins was called: the epoch's time is its steps' alone

    def step_begins(self) -> None:
        """The next step starts now: the time since the last one ended is no step's, and the epoch's time is then
        its steps' alone (a model.fit call's set-up before its first batch and its wind-down after its last:
        shared/training/keras_fit.py). Trainers that do not call it count everything from the epoch's start to its
        end, their input preparation included."""
        self.steps_only, self._last = True, time.perf_counter()

    def add(self, mean_loss, correct, count: int, state_checksums=None):
        self.add_steps([mean_loss], [correct], [count], None if state_checksums is None else [state_checksums])

    def add_steps(self, mean_losses, corrects, counts: Sequence[int], state_checksums=None):
        """Several steps from one call: [steps] tensors of losses and correct counts.

        Each step gets the call's wall time divided by its number of steps. `state_checksums`
        ([steps] of shared.measure.checksums.state_checksums, one at the start of each step), if given,
        stay tensors until the epoch ends.
        """
        if state_checksums is not None:
            self.state_checksums.append(state_checksums)
        now = time.perf_counter()
        self.call_seconds.append(now - self._last)
        self.step_times_ms += [(now - self._last) * 1e3 / len(counts)] * len(counts)
        self._last = now
        self.losses.append(mean_losses)
        self.corrects.append(corrects)
        self.counts += list(counts)
        self.on_steps(len(counts))

    def finish(self):
        """(step_losses, mean loss, accuracy, seconds) for what was added."""
        losses = np.concatenate([_host(loss) for loss in self.losses] or [[]]).astype(np.float64)  # host sync
        counts = np.array(self.counts, dtype=np.float64)
        correct = float(sum(_host(c).sum() for c in self.corrects))
        seconds = sum(self.call_seconds) if self.steps_only else time.perf_counter() - self.start
        return losses.tolist(), float((losses * counts).sum() / counts.sum()), float(correct / counts.sum()), seconds


def _host_array(value) -> np.ndarray:
    """A tensor (a replicated DTensor reads one device's copy) as a float64 array."""
    return np.asarray(value.numpy() if hasattr(value, "numpy") else value, np.float64)


def _host(values) -> np.ndarray:
    """A list of scalars or a [steps] tensor (a replicated DTensor reads one device's copy) as a 1-D array."""
    if isinstance(values, list):
        return np.array([float(value) for value in values], dtype=np.float64)
    return np.reshape(np.asarray(values.numpy() if hasattr(values, "numpy") else values, np.float64), -1)
