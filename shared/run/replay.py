"""The first-difference replay: when a verdict is MISMATCH, the first mismatching step again, on the reference and
on that trainer, in float64 and from the same state, recording every tapped value and its gradient.

The reference trains up to the step in this process and writes its state to a temporary checkpoint, which the
trainer restores as it would --restore (any trainer, any mesh); each then records the step's taps without
training it (shared/training/loop.py, config.replay_step), and shared/judge/first_difference.py names the first
tap that differs. Cost: building both trainers and tracing one recording step each, plus the reference's steps up
to the mismatching one.
"""

import itertools
import tempfile
import time
from typing import Callable, Optional, Tuple

import tensorflow as tf

from shared.config import Config
from shared.judge.first_difference import FirstDifference, locate
from shared.judge.parity import tolerances
from shared.measure.taps import Taps
from shared.training.batches import batch_slices, epoch_batches
from shared.training.checkpoint import TrainingState
from shared.training.data import Dataset
from shared.training.reference import ReferenceTrainer, train_step


def reference_at(config: Config, data: Dataset, device: str, step: int, directory: str) -> Tuple[Taps, Optional[str]]:
    """The reference's taps at `step` after training the steps before it, and its checkpoint there (None at 0)."""
    batches = itertools.chain.from_iterable(  # every trainer's global batches, epoch after epoch
        epoch_batches(data.x_train, data.y_train, config.batch_size, epoch, config.shuffle, config.seed)
        for epoch in itertools.count()
    )
    with tf.device(device):
        trainer = ReferenceTrainer(config, data, device)
        steps_per_epoch = len(batch_slices(len(data.y_train), config.batch_size))
        for _ in range(step):
            train_step(trainer.model, trainer.optimizer, *next(batches))
        taps = trainer.taps(*next(batches))
        taps.step = step
        if not step:
            return taps, None
        state = TrainingState("reference", config, *trainer.checkpointed, len(data.y_train))
        return taps, state.save(directory, step // steps_per_epoch)


def first_difference(
    entry, config: Config, data: Dataset, device: str, train: Callable, step: int, float64: Callable
) -> FirstDifference:
    """Replay `step` for `entry` (trained by `train(entry, config)`); `float64(config)`: the run's float64 config."""
    started = time.perf_counter()
    replay = float64(config)
    with tempfile.TemporaryDirectory(prefix="replay-") as directory:
        reference, restore = reference_at(replay, data, device, step, directory)
        result = train(entry, replay.replace(replay_step=step, restore=restore))
    seconds = time.perf_counter() - started
    if result.failed or result.history.taps is None:
        return FirstDifference(step, "", "", 0.0, [], seconds, f"the replay failed ({result.error})")
    return locate(result.history.taps, reference, tolerances("float64")["gradient"], seconds)
