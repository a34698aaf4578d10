"""What a run trains and tests on, whatever its source: the arrays, where they came from and why."""

import dataclasses
import socket
import threading
from typing import Optional

import numpy as np

from dtensor_vs_mirrored.shared.errors import UsageError

PROBE_SECONDS = 3.0  # how long a download host has to answer before --data auto takes the shipped data


@dataclasses.dataclass(frozen=True)
class Dataset:
    # [N, *input_shape] in the model's input dtype: MNIST float32 [N, 784] in [0, 1]; a model of several named
    # inputs: a dict {name: [N, *shape]} (shared/training/npz_inputs.py, shared/training/batch_inputs.py)
    x_train: object
    y_train: np.ndarray  # int64 [N, *label_shape]: classes, or negative for a label that does not count
    x_test: object
    y_test: np.ndarray
    source: str  # "tfds", "embedded", the IDX directory or the .npz file
    reason: str  # one line: why this source was used
    fallback: str = ""  # --data auto trained on the embedded set instead of tfds: why; "" otherwise

    def describe(self) -> str:
        return f"data: {self.source} ({self.reason}); {len(self.y_train)} train, {len(self.y_test)} test examples"


def host_answers(host: str, port: int = 443, seconds: float = PROBE_SECONDS) -> bool:
    """True if a TCP connection to host opens within `seconds` (DNS included, hence the thread)."""
    result = []

    def probe():
        try:
            socket.create_connection((host, port), timeout=seconds).close()
            result.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(seconds)
    return bool(result)


def example_count(name: str, requested: Optional[int], default: int, available: int, hint: str) -> int:
    """How many `name` examples to use: `requested`, else min(default, available); checked."""
    count = min(default, available) if requested is None else requested  # Config checked it is positive
    if count > available:
        raise UsageError(
            f"--{name}-examples {count} is more than the {available} {name} "
            f"examples in {hint}; use --{name}-examples {available} or fewer"
        )
    return count


def take(name: str, inputs, labels, requested: Optional[int], default: int, hint: str):
    count = example_count(name, requested, default, len(labels), hint)
    return inputs[:count], labels[:count]
