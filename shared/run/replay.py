"""The first-difference replay: when a verdict is MISMATCH, the first mismatching step again, on the reference and
on that trainer, in float64 and from the same state, recording every tapped value and its gradient.

The reference trains up to the step and writes its state (a mid-epoch checkpoint that says which batch it holds),
which the trainer restores as it would --restore (any trainer, any mesh); each then records the step's taps
without training it (shared/training/loop.py, RunControl.replay_step), and shared/judge/first_difference.py names
the first tap that differs. Cost: building both trainers and tracing one recording step each, plus the
reference's steps up to the mismatching one.
"""

import os
import tempfile
import time
from typing import Callable

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.judge.first_difference import FirstDifference, locate
from dtensor_vs_mirrored.shared.judge.parity import tolerances
from dtensor_vs_mirrored.shared.training.protocol import RunControl


def first_difference(
    entry, reference, config: Config, train: Callable, step: int, float64: Callable
) -> FirstDifference:
    """Replay `step` for `entry` against the `reference` entry, both trained by `train(entry, config, control)`;
    `float64(config)`: the run's float64 config. A trainer that cannot run in float64 here (TensorFlow 2.12's
    DTensor) gives no replay and says why: the run's verdict stands, no exit 2."""
    try:
        return _replay(entry, reference, config, train, step, float64)
    except UsageError as error:
        return FirstDifference(step, "", "", 0.0, [], 0.0, f"no float64 replay here: {error}")


def _replay(entry, reference, config: Config, train: Callable, step: int, float64: Callable) -> FirstDifference:
    started = time.perf_counter()
    replay = float64(config)
    with tempfile.TemporaryDirectory(prefix="replay-") as directory:
        state = os.path.join(directory, f"step-{step}")
        ours = train(reference, float64(reference.config), RunControl(replay_step=step, replay_state=state))
        if ours.failed or ours.history.taps is None:
            return FirstDifference(
                step, "", "", 0.0, [], time.perf_counter() - started, f"the replay failed ({ours.error})"
            )
        restore = state if step else None
        result = train(entry, replay.replace(restore=restore), RunControl(replay_step=step))
    seconds = time.perf_counter() - started
    if result.failed or result.history.taps is None:
        return FirstDifference(step, "", "", 0.0, [], seconds, f"the replay failed ({result.error})")
    return locate(result.history.taps, ours.history.taps, tolerances("float64")["gradient"], seconds)
