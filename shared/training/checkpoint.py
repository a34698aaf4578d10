"""Checkpoints: a trainer's whole training state in TensorFlow's own format, complete or absent.

    python compare.py --data embedded --epochs 2 --checkpoint-dir ckpt
    python compare.py --data embedded --epochs 3 --restore ckpt/dtensor --trainers mirrored

Every trainer writes the same object graph with `tf.train.Checkpoint` (model/<variable name>,
optimizer/{m,v,step}, progress), so any trainer restores what any other wrote, whatever the mesh
or layout. Each epoch goes to DIR/<trainer>/.epoch-NNNN.partial and is renamed to epoch-NNNN when
complete; older epochs beyond --keep-checkpoints are deleted after it. What is checked before a
restore, and why not CheckpointManager: docs/checkpoints-and-export.md.
"""

import os
import re
import shutil
from typing import Callable, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.files import check_writable_dir, partial_path, publish_directory
from dtensor_vs_mirrored.shared.model.registry import definition_for, model_mismatch
from dtensor_vs_mirrored.shared.training import export
from dtensor_vs_mirrored.shared.training.batches import batch_slices

PREFIX = "ckpt"  # the file prefix inside a checkpoint directory: ckpt.index, ckpt.data-*
EPOCH_DIR = re.compile(r"^epoch-(\d+)$")
_KEY = "progress/{}/.ATTRIBUTES/VARIABLE_VALUE"  # how tf.train.Checkpoint names progress' variables


class Progress(tf.Module):
    """Where the run is and what it is for, as plain host variables (any trainer can hold them)."""

    def __init__(self, model: str, optimizer: str, dtype: str):
        super().__init__()
        with tf.device("CPU:0"):
            self.dtype = tf.Variable(dtype, trainable=False)  # "float32" or "float64" (--dtype)
            self.epoch = tf.Variable(tf.constant(0, tf.int64), trainable=False)  # epochs completed
            self.batch = tf.Variable(tf.constant(0, tf.int64), trainable=False)  # of the next epoch, done
            self.step = tf.Variable(tf.constant(0, tf.int64), trainable=False)  # optimizer steps so far
            self.model = tf.Variable(model, trainable=False)  # ModelDefinition.name, e.g. "mlp 784-700-500-10"
            self.optimizer = tf.Variable(optimizer, trainable=False)  # "adam" or "sgd"


def latest(directory: str) -> Optional[str]:
    """The newest complete checkpoint directory in a DIR/<trainer>, or None."""
    epochs = [
        (int(match.group(1)), name)
        for name in os.listdir(directory)
        for match in [EPOCH_DIR.match(name)]
        if match and os.path.exists(os.path.join(directory, name, PREFIX + ".index"))
    ]
    return os.path.join(directory, max(epochs)[1]) if epochs else None


def resolve(path: str) -> str:
    """--restore PATH -> a checkpoint prefix (".../epoch-0002/ckpt"); UsageError if there is none."""
    if os.path.exists(path + ".index"):
        return path
    if os.path.exists(os.path.join(path, PREFIX + ".index")):
        return os.path.join(path, PREFIX)
    if os.path.isdir(path):
        newest = latest(path)
        if newest:
            return os.path.join(newest, PREFIX)
        trainers = sorted(
            name
            for name in os.listdir(path)
            if os.path.isdir(os.path.join(path, name)) and latest(os.path.join(path, name))
        )
        if trainers:
            raise UsageError(
                f"--restore {path} holds checkpoints of {', '.join(trainers)}; "
                f"name one, e.g. --restore {os.path.join(path, trainers[0])}"
            )
    raise UsageError(
        f"--restore {path}: no checkpoint there; give a DIR/<trainer> or DIR/<trainer>/epoch-NNNN "
        f"that --checkpoint-dir DIR wrote"
    )


def read_progress(prefix: str) -> dict:
    """The progress record of a checkpoint, without restoring anything."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        progress = {name: reader.get_tensor(_KEY.format(name)) for name in ("epoch", "batch", "step", "optimizer")}
        # Checkpoints from before --model recorded the MLP's layer sizes instead of the model's name.
        progress["model"] = (
            reader.get_tensor(_KEY.format("model"))
            if reader.has_tensor(_KEY.format("model"))
            else ("mlp " + "-".join(str(size) for size in reader.get_tensor(_KEY.format("layer_sizes")))).encode()
        )
        # Checkpoints from before --dtype hold float32 state and no dtype record.
        progress["dtype"] = (
            reader.get_tensor(_KEY.format("dtype")) if reader.has_tensor(_KEY.format("dtype")) else b"float32"
        )
        return progress
    except (tf.errors.OpError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UsageError(f"--restore {prefix}: not a checkpoint of this project ({reason})") from None


def check_restore(config: Config, mid_epoch: bool = False) -> Tuple[str, dict]:
    """(prefix, progress) of --restore; UsageError if it is for another model or optimizer, or has no epochs left;
    `mid_epoch`: the replay's restore of a state written inside an epoch (a step's, shared/run/replay.py)."""
    prefix = resolve(config.restore)
    progress = read_progress(prefix)
    shown = os.path.dirname(prefix)
    written_model, model = progress["model"].decode(), definition_for(config).name
    if written_model != model:
        raise UsageError(f"checkpoint {shown} {model_mismatch(written_model, model)}")
    written_optimizer = progress["optimizer"].decode()
    if written_optimizer != config.optimizer:
        raise UsageError(
            f"checkpoint {shown} holds {written_optimizer} state but --optimizer {config.optimizer} "
            f"was given ({config.optimizer} vs {written_optimizer}); use --optimizer {written_optimizer}"
        )
    written_dtype = progress["dtype"].decode()
    if written_dtype != config.dtype:  # restoring would need a conversion; starting over is cheap
        raise UsageError(
            f"checkpoint {shown} holds {written_dtype} state but --dtype {config.dtype} was given; "
            f"use --dtype {written_dtype}"
        )
    check_clipping(config, prefix, shown)
    if mid_epoch:
        return prefix, progress
    if int(progress["batch"]) != 0:
        raise UsageError(
            f"checkpoint {shown} was written {int(progress['batch'])} batches into an epoch; "
            f"trainers resume at epoch ends only"
        )
    if int(progress["epoch"]) >= config.epochs:
        raise UsageError(
            f"checkpoint {shown} is at epoch {int(progress['epoch'])} and --epochs {config.epochs} "
            f"leaves nothing to train (--epochs is the total); use --epochs "
            f"{int(progress['epoch']) + 1} or more"
        )
    return prefix, progress


CLIPPED_KEY = "optimizer/clipped/.ATTRIBUTES/VARIABLE_VALUE"  # --clip-global-norm's count (shared/training/optim.py)


def check_clipping(config: Config, prefix: str, shown: str) -> None:
    """A checkpoint holds --clip-global-norm's count of clipped steps exactly when it was written with it."""
    clipped = tf.train.load_checkpoint(prefix).has_tensor(CLIPPED_KEY)
    if clipped != (config.clip_global_norm is not None):
        raise UsageError(
            f"checkpoint {shown} was written {'with' if clipped else 'without'} --clip-global-norm; "
            + ("give --clip-global-norm X to restore it" if clipped else "drop --clip-global-norm to restore it")
        )


def check_config(config: Config) -> None:
    """--restore, --checkpoint-dir and --export, before anything trains."""
    if config.restore:
        check_restore(config)
    for flag, directory in (("--checkpoint-dir", config.checkpoint_dir), ("--export", config.export)):
        if directory:
            check_writable_dir(flag, directory, create=True)
    if config.export:
        export.check_targets(config.export, sorted({"reference", *config.trainers}))  # the reference always trains
        export.check_exportable(definition_for(config))


class TrainingState:
    """A trainer's model, optimizer and progress as one tf.train.Checkpoint.

    trainer: "reference", "dtensor" or "mirrored" (the directory under --checkpoint-dir).
    """

    def __init__(self, trainer: str, config: Config, model, optimizer, train_examples: int, log: Callable = print):
        self.trainer, self.config, self.log = trainer, config, log
        self.steps_per_epoch = len(batch_slices(train_examples, config.batch_size))
        self.progress = Progress(model.definition.name, config.optimizer, config.dtype)
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, progress=self.progress)
        self.trained_state = tf.train.Checkpoint(model=model, optimizer=optimizer)  # what restore reads

    def restore(self, mid_epoch: bool = False) -> int:
        """Restore --restore, if given; returns the number of epochs already trained (0 without). `mid_epoch`: a
        replayed step's state may be written inside an epoch."""
        if not self.config.restore:
            return 0
        prefix, progress = check_restore(self.config, mid_epoch)
        self.trained_state.read(prefix).expect_partial().assert_existing_objects_matched()  # all but progress
        # Progress from the file, not through the object graph: when a DTensor mesh is involved,
        # TensorFlow restores inside a function on the DTensor device, and these plain host variables
        # then read back their old values in some runs (TF 2.21).
        for name, value in progress.items():
            getattr(self.progress, name).assign(value)
        epoch, step = int(progress["epoch"]), int(progress["step"])
        if not self.config.quiet:
            self.log(
                f"{self.trainer:<10} restored {os.path.dirname(prefix)}: epoch {epoch}, step {step}; "
                f"training epochs {epoch + 1}..{self.config.epochs}"
            )
        return epoch

    def save(self, directory: str, epoch: int) -> str:
        """Write the state after `epoch` (1-based) epochs to directory/epoch-NNNN, atomically; returns it."""
        return self.write(os.path.join(directory, f"epoch-{epoch:04d}"), epoch * self.steps_per_epoch)

    def write(self, final: str, step: int) -> str:
        """Write the state after `step` optimizer steps to directory `final`, atomically, its progress saying which
        epoch and batch that is (the replay's step may be inside an epoch); returns `final`."""
        partial = partial_path(final)
        epoch, batch = divmod(step, self.steps_per_epoch)
        self.progress.epoch.assign(epoch)
        self.progress.batch.assign(batch)
        self.progress.step.assign(step)
        self.checkpoint.write(os.path.join(partial, PREFIX))
        publish_directory(partial, final)
        return final

    def save_epoch(self, epoch: int) -> Optional[str]:
        """At the end of an epoch (1-based): write DIR/<trainer>/epoch-NNNN if --checkpoint-dir was given."""
        if not self.config.checkpoint_dir:
            return None
        directory = os.path.join(self.config.checkpoint_dir, self.trainer)
        os.makedirs(directory, exist_ok=True)
        written = self.save(directory, epoch)
        removed = remove_older(directory, epoch - self.config.keep_checkpoints) if self.config.keep_checkpoints else []
        if not self.config.quiet:
            self.log(
                f"{self.trainer:<10} checkpoint {written}" + (f" (removed {', '.join(removed)})" if removed else "")
            )
        return written


def remove_older(directory: str, last_removed: int) -> List[str]:
    """Delete the epoch-N directories with N <= last_removed (--keep-checkpoints); returns their names.

    Runs after the newest is published, so the newest N are complete when older ones go;
    a later epoch left by an earlier run is not this run's to delete.
    """
    removed = []
    for name in sorted(os.listdir(directory)):
        match = EPOCH_DIR.match(name)
        if match and int(match.group(1)) <= last_removed:
            shutil.rmtree(os.path.join(directory, name))
            removed.append(name)
    return removed


def weights_of(prefix: str, definition) -> List[np.ndarray]:
    """The model weights stored in a checkpoint, in the definition's order (for tests and inspection)."""
    reader = tf.train.load_checkpoint(prefix)
    return [reader.get_tensor(f"model/{name}/.ATTRIBUTES/VARIABLE_VALUE") for name in definition.names]
