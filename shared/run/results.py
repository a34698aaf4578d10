"""One trainer trained in this process: its result, or its failure in one line (what a trainer process sends back
too, shared/run/worker.py)."""

import dataclasses
import sys
import traceback
from typing import Optional, Sequence

import tensorflow as tf

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError, one_line
from dtensor_vs_mirrored.shared.measure.history import History
from dtensor_vs_mirrored.shared.measure.memory import peak_rss_mb, start_peak, with_peaks
from dtensor_vs_mirrored.shared.model.registry import definition_for
from dtensor_vs_mirrored.shared.report.progress import Printed
from dtensor_vs_mirrored.shared.training.data import Dataset
from dtensor_vs_mirrored.shared.training.protocol import PLAIN_RUN, RunControl
from dtensor_vs_mirrored.shared.training.registry import fit_and_keep


@dataclasses.dataclass
class TrainerResult:
    name: str
    history: Optional[History] = None
    error: str = ""  # one line when the trainer raised
    traceback: str = ""  # and its whole traceback, for the JSON report (and --verbose)
    peak_memory_mb: float = 0.0  # GPU: TensorFlow's peak allocation; CPU: the process's peak RSS while it trained
    # CPU: how far the process's RSS rose above its level when the trainer started; None where it cannot be told
    peak_memory_rise_mb: Optional[float] = None
    # RunControl.keep: the trained trainer, kept for timing (shared/run/timing.py): `time(steps)` a round of its
    # steady call, `release()`; a trainer process's is its proxy. Not pickled: it stays where it trained.
    kept: Optional[object] = None

    @property
    def failed(self) -> bool:
        return self.history is None

    @property
    def peak_shown_mb(self) -> float:
        """The results' "peak MB": the rise where it could be told (CPU), else the peak."""
        return self.peak_memory_mb if self.peak_memory_rise_mb is None else self.peak_memory_rise_mb

    def __getstate__(self):
        return {**self.__dict__, "kept": None}

    def release(self) -> None:
        """Let the kept trainer go (its process's memory, its variables)."""
        if self.kept is not None:
            self.kept.release()
            self.kept = None


def reset_peak_memory(config: Config, devices: Sequence[str]) -> Optional[float]:
    """Before a trainer: its devices' peak allocation reset (GPU); its process's peak RSS reset, and the RSS now
    returned (CPU, where the system allows it; else None)."""
    if config.device_type == "GPU":
        for device in devices:
            tf.config.experimental.reset_memory_stats(device)
        return None
    return start_peak()


def peak_memory(config: Config, devices: Sequence[str], baseline: Optional[float]) -> dict:
    """TrainerResult's peak figures after a trainer (`baseline`: reset_peak_memory's)."""
    if config.device_type == "GPU":
        return {"peak_memory_mb": sum(tf.config.experimental.get_memory_info(d)["peak"] for d in devices) / 2**20}
    peak = peak_rss_mb()
    return {"peak_memory_mb": peak, "peak_memory_rise_mb": None if baseline is None else max(peak - baseline, 0.0)}


def printed(log, config: Config, control: RunControl) -> Printed:
    """What a trainer prints as it trains: no accuracy for a model that has none (a regression)."""
    return Printed(log, config.quiet, control.progress_bar, definition_for(config).has_accuracy)


def train_one(
    name: str, config: Config, data: Dataset, devices: Sequence[str], log, control: RunControl = PLAIN_RUN
) -> TrainerResult:
    """Run one trainer in this process, its lines to `log`; an exception becomes a failed result with a one-line
    reason."""
    baseline = reset_peak_memory(config, devices)
    try:
        history, kept = fit_and_keep(name, config, data, devices, printed(log, config, control), control)
    except UsageError:
        raise
    except Exception as error:  # noqa: BLE001 - any trainer failure is reported, the others still run
        result = TrainerResult(name, error=one_line(error), traceback="".join(traceback.format_exception(error)))
        if config.verbose:  # the one line is in the tables; a maintainer wants the whole story too
            print(f"{name}: FAILED: {result.error}\n{result.traceback}", end="", file=sys.stderr, flush=True)
        return result
    if config.device_type == "GPU":  # TensorFlow's own peak per device, beside the bytes the trainer holds
        history.memory_per_device = with_peaks(
            history.memory_per_device,
            {device: tf.config.experimental.get_memory_info(device)["peak"] for device in devices},
        )
    return TrainerResult(name, history, kept=kept, **peak_memory(config, devices, baseline))
