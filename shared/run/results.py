"""One trainer trained in this process: its result, or its failure in one line (what a trainer process sends back
too, shared/run/worker.py)."""

import dataclasses
import resource
import sys
import traceback
from typing import Optional, Sequence

import tensorflow as tf

from shared.config import Config
from shared.errors import UsageError
from shared.measure.history import History
from shared.measure.memory import with_peaks
from shared.report.progress import Printed
from shared.training.data import Dataset
from shared.training.protocol import PLAIN_RUN, RunControl
from shared.training.registry import fit_and_keep


@dataclasses.dataclass
class TrainerResult:
    name: str
    history: Optional[History] = None
    error: str = ""  # one line when the trainer raised
    traceback: str = ""  # and its whole traceback, for the JSON report (and --verbose)
    peak_memory_mb: float = 0.0
    # RunControl.keep: the trained trainer, kept for timing (shared/run/timing.py): `time(steps)` a round of its
    # steady call, `release()`; a trainer process's is its proxy. Not pickled: it stays where it trained.
    kept: Optional[object] = None

    @property
    def failed(self) -> bool:
        return self.history is None

    def __getstate__(self):
        return {**self.__dict__, "kept": None}

    def release(self) -> None:
        """Let the kept trainer go (its process's memory, its variables)."""
        if self.kept is not None:
            self.kept.release()
            self.kept = None


def peak_memory_mb(config: Config, devices: Sequence[str]) -> float:
    """GPU: TensorFlow's peak allocation summed over the devices. CPU: the process's peak RSS so far."""
    if config.device_type == "GPU":
        return sum(tf.config.experimental.get_memory_info(d)["peak"] for d in devices) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def train_one(
    name: str, config: Config, data: Dataset, devices: Sequence[str], log, control: RunControl = PLAIN_RUN
) -> TrainerResult:
    """Run one trainer in this process, its lines to `log`; an exception becomes a failed result with a one-line
    reason."""
    if config.device_type == "GPU":
        for device in devices:
            tf.config.experimental.reset_memory_stats(device)
    try:
        history, kept = fit_and_keep(name, config, data, devices, Printed(log, config.quiet), control)
    except UsageError:
        raise
    except Exception as error:  # noqa: BLE001 - any trainer failure is reported, the others still run
        last = traceback.extract_tb(error.__traceback__)[-1]
        reason = (
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''} "
            f"({last.filename.rsplit('/', 1)[-1]}:{last.lineno})"
        )
        result = TrainerResult(name, error=reason.strip(), traceback="".join(traceback.format_exception(error)))
        if config.verbose:  # the one line is in the tables; a maintainer wants the whole story too
            print(f"{name}: FAILED: {result.error}\n{result.traceback}", end="", file=sys.stderr, flush=True)
        return result
    if config.device_type == "GPU":  # TensorFlow's own peak per device, beside the bytes the trainer holds
        history.memory_per_device = with_peaks(
            history.memory_per_device,
            {device: tf.config.experimental.get_memory_info(device)["peak"] for device in devices},
        )
    return TrainerResult(name, history, peak_memory_mb=peak_memory_mb(config, devices), kept=kept)
