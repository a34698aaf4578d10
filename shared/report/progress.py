"""What a trainer's run prints as it trains: its own lines, a progress bar per epoch on a terminal, and one
fixed-format line per epoch with the same keys for every trainer (the values are the history's)."""

import os
import sys
from typing import Callable

from tqdm import tqdm

# "1": this process draws no progress bar; a second lane's trainer process (shared/run/worker.py): two would overwrite.
NO_PROGRESS_BAR = "COMPARE_NO_PROGRESS_BAR"


def format_epoch_line(trainer: str, record, epochs: int, accuracy: bool = True) -> str:
    """One fixed-format line of a shared.measure.history.EpochRecord, the same keys for every trainer ("-" for test
    metrics not evaluated, and for the accuracies of a model that has none: a regression)."""
    shown = lambda value: "-" if value is None else f"{value:.4f}"  # noqa: E731
    train_accuracy, test_accuracy = (record.train_accuracy, record.test_accuracy) if accuracy else (None, None)
    return (
        f"{trainer:<10} epoch {record.epoch}/{epochs}  train_loss {record.train_loss:.4f}  "
        f"train_acc {shown(train_accuracy)}  test_loss {shown(record.test_loss)}  "
        f"test_acc {shown(test_accuracy)}  time {record.train_seconds:.2f}s"
    )


class Printed:
    """shared.training.protocol.Progress, printed through `log` (print, or a trainer process's channel); `quiet`
    (--quiet): no epoch lines; `bar` False: no progress bar (RunControl.progress_bar)."""

    def __init__(self, log: Callable[[str], None] = print, quiet: bool = False, bar: bool = True, accuracy=True):
        self.log, self.quiet, self.bar_wanted, self.accuracy = log, quiet, bar, accuracy
        self.bar = None

    def line(self, text: str) -> None:
        self.log(text)

    def epoch_started(self, label: str, steps: int) -> None:
        """A progress bar on a terminal only (tqdm); logs and pipes get the epoch lines alone."""
        drawn = self.bar_wanted and sys.stderr.isatty() and os.environ.get(NO_PROGRESS_BAR) != "1"
        self.bar = tqdm(total=steps, desc=label, unit="step", leave=False, disable=not drawn)

    def steps_done(self, count: int) -> None:
        if self.bar is not None:
            self.bar.update(count)

    def epoch_done(self, trainer: str, record, epochs: int) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if not self.quiet:
            self.log(format_epoch_line(trainer, record, epochs, self.accuracy))
