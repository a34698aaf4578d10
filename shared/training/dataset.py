"""What a run trains and tests on, whatever its source: the arrays, where they came from and why."""

import dataclasses
import socket
import threading

import numpy as np

PROBE_SECONDS = 3.0  # how long a download host has to answer before --data auto takes the shipped data


@dataclasses.dataclass(frozen=True)
class Dataset:
    x_train: np.ndarray  # [N, *input_shape] in the model's input dtype: MNIST float32 [N, 784] in [0, 1]
    y_train: np.ndarray  # int64 [N, *label_shape]: classes, or negative for a label that does not count
    x_test: np.ndarray
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
