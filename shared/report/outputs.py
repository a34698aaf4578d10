"""What compare.py writes: the JSON report, the plots and TensorBoard scalars, each atomically, after the tables
are printed; and the check, before anything trains, that every output path can be written."""

import json
import os

import tensorflow as tf

from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.files import check_writable_dir, write_atomically
from dtensor_vs_mirrored.shared.judge.verdict import exit_ok
from dtensor_vs_mirrored.shared.report.document import finite, report_dict
from dtensor_vs_mirrored.shared.report.tables import print_tables


def check_outputs(config) -> None:
    """Reject unwritable output paths before any training starts."""
    if config.json:
        if os.path.isdir(config.json):
            raise UsageError(f"--json {config.json} is a directory; give a file path such as {config.json}/report.json")
        check_writable_dir("--json", os.path.dirname(os.path.abspath(config.json)), create=False)
    for flag, directory in (("--plots", config.plots), ("--logdir", config.logdir)):
        if directory:
            check_writable_dir(flag, directory, create=True)


def publish(config, run, sweep=()) -> int:
    """Print the tables, write --json, --plots and --logdir; return compare.py's exit code (0: parity holds)."""
    print_tables(run, sweep)
    write_outputs(config, run, sweep)
    return 0 if exit_ok(run, sweep) else 1


class InterruptedWhileWriting(KeyboardInterrupt):
    """Ctrl-C while the outputs were being written: those written are whole (each atomically), the rest absent."""


def write_outputs(config, run, sweep) -> None:
    try:
        write_each(config, run, sweep)
    except KeyboardInterrupt:
        raise InterruptedWhileWriting("interrupted while writing the outputs: each one written is whole") from None


def write_each(config, run, sweep) -> None:
    if config.json:
        payload = json.dumps(finite(report_dict(run, sweep)), indent=2, allow_nan=False).encode()
        write_atomically(config.json, payload)
    if config.plots:
        from dtensor_vs_mirrored.shared.report import plots

        plots.write_all(config.plots, run, sweep)
    if config.logdir:
        write_tensorboard(config.logdir, run)


def write_tensorboard(logdir: str, run) -> None:
    """Scalars per trainer: the loss of every step and the per-epoch metrics."""
    for name, result in run.results.items():
        if result.history is None:
            continue
        writer = tf.summary.create_file_writer(os.path.join(logdir, name))
        with writer.as_default():
            for step, loss in enumerate(result.history.step_losses):
                tf.summary.scalar("step_loss", loss, step=step)
            for record in result.history.epochs:
                for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
                    tf.summary.scalar(key, getattr(record, key), step=record.epoch)
        writer.close()
