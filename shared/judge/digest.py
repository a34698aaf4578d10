"""Digests of named weight arrays: what a report keeps of a trainer's final weights.

A report cannot hold every weight (megabytes of JSON for the MLP alone), yet
`--baseline` (shared/judge/baseline.py) must compare them across machines at the dtype's
tolerance. Each named array keeps: its shape and dtype; sum, sum |x| and sum x**2 as
exactly rounded sums (math.fsum of the float64 values, so the same digits on any machine
for the same array); SAMPLE_COUNT values at evenly spaced positions; and a sha256 of its
bytes (C order, little-endian), which tells "bit for bit" from "within the tolerance".
Cost: one pass over each array, on the host.
"""

import hashlib
import math
from typing import List, Sequence

import numpy as np

SAMPLE_COUNT = 8
SUMS = ("sum", "sum_abs", "sum_squares")


def sample_indices(size: int) -> List[int]:
    """SAMPLE_COUNT flat positions spread evenly from the first element to the last (fewer if the array is smaller)."""
    if size == 0:
        return []
    return sorted({int(i) for i in np.linspace(0, size - 1, min(SAMPLE_COUNT, size)).round()})


def array_sha256(array: np.ndarray) -> str:
    array = np.asarray(array)
    return hashlib.sha256(np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()).hexdigest()


def arrays_sha256(arrays: Sequence[np.ndarray]) -> str:
    """One sha256 over several arrays' bytes, each with its shape and dtype (the data a run trained on)."""
    hashed = hashlib.sha256()
    for array in arrays:
        array = np.asarray(array)
        hashed.update(f"{array.dtype.name}{array.shape}".encode())
        hashed.update(np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes())
    return hashed.hexdigest()


def data_sha256(data) -> str:
    """The images and labels a run trained and tested on (a shared.training.data.Dataset)."""
    return arrays_sha256([*flat(data.x_train), data.y_train, *flat(data.x_test), data.y_test])


def flat(x) -> list:
    """One input's array, or a model of several named inputs' arrays by name (a dict)."""
    return [x[name] for name in sorted(x)] if isinstance(x, dict) else [x]


def digest(name: str, array) -> dict:
    """One named array's digest (the report's `final_weights` entries)."""
    array = np.asarray(array)
    values = array.astype(np.float64).ravel()
    indices = sample_indices(values.size)
    listed = values.tolist()  # math.fsum is ~5x faster over Python floats than over numpy scalars
    return {
        "name": name,
        "shape": list(array.shape),
        "dtype": array.dtype.name,
        "sum": math.fsum(listed),
        "sum_abs": math.fsum(np.abs(values).tolist()),
        "sum_squares": math.fsum((values * values).tolist()),
        "sample_indices": indices,
        "sample_values": [listed[i] for i in indices],
        "sha256": array_sha256(array),
    }


def weight_names(history) -> List[str]:
    """The names of history.final_weights, in order: the model's labels, as the training loop records them
    (History.weight_names); "weight i" for a history without them."""
    if history.weight_names:
        return list(history.weight_names)
    return [f"weight {i}" for i in range(len(history.final_weights))]


def digests(history) -> List[dict]:
    return [digest(name, array) for name, array in zip(weight_names(history), history.final_weights)]


def same_bytes(digests_a: Sequence[dict], digests_b: Sequence[dict]) -> bool:
    return len(digests_a) == len(digests_b) and all(
        a["sha256"] == b["sha256"] and a["shape"] == b["shape"] and a["dtype"] == b["dtype"]
        for a, b in zip(digests_a, digests_b)
    )
