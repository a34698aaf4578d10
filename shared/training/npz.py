"""`--data FILE.npz`: your own arrays, checked against the model's spec before anything trains.

The file holds x_train, y_train, x_test and y_test: inputs [N, *input_shape] (float inputs as float32 or
float64, token inputs as integers) and labels [N, *label_shape] as integers, 0 to classes - 1, or negative
for a label that does not count (a padded position). Anything else is one line naming the array.
"""

import os
import zipfile
from typing import Optional

import numpy as np

from shared.errors import UsageError
from shared.training.dataset import Dataset, take

KEYS = ("x_train", "y_train", "x_test", "y_test")


def load(path: str, definition, train_examples: Optional[int], test_examples: Optional[int]) -> Dataset:
    """The file's arrays for `definition` (ModelDefinition), cut to the requested example counts."""
    if not os.path.isfile(path):
        raise UsageError(f"--data {path}: no such file; give an .npz with arrays {', '.join(KEYS)}")
    try:
        with np.load(path, allow_pickle=False) as file:
            missing = [key for key in KEYS if key not in file.files]
            if missing:
                raise UsageError(
                    f"--data {path}: no array {missing[0]}; the file holds {', '.join(file.files) or 'none'} "
                    f"and needs {', '.join(KEYS)}"
                )
            arrays = {key: file[key] for key in KEYS}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise UsageError(f"--data {path}: cannot read it as .npz ({error}); write it with numpy.savez") from None
    splits = []
    for split, requested in (("train", train_examples), ("test", test_examples)):
        x = inputs(path, f"x_{split}", arrays[f"x_{split}"], definition)
        y = labels(path, f"y_{split}", arrays[f"y_{split}"], definition)
        if len(x) != len(y):
            raise UsageError(f"--data {path}: x_{split} has {len(x)} examples but y_{split} has {len(y)}")
        splits += take(split, x, y, requested, len(y), path)
    return Dataset(*splits, path, "your arrays")


def inputs(path: str, key: str, x: np.ndarray, definition) -> np.ndarray:
    want, dtype = tuple(definition.input_shape), np.dtype(definition.input_dtype)
    if x.ndim < 1 or tuple(x.shape[1:]) != want:
        raise UsageError(
            f"--data {path}: {key} has shape {list(x.shape)}; the model takes [N, {', '.join(map(str, want))}] "
            f"({definition.name})"
        )
    if dtype.kind == "f":
        if x.dtype.kind != "f":
            raise UsageError(
                f"--data {path}: {key} is {x.dtype}; the model takes float inputs: scale and cast them "
                f"(images: x.astype('float32') / 255)"
            )
        bad = np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))
        if bad.size:
            raise UsageError(f"--data {path}: {key} holds NaN or inf, first in example {bad[0]}; remove or fix it")
        return x.astype(np.float32)
    if x.dtype.kind not in "iu":
        raise UsageError(f"--data {path}: {key} is {x.dtype}; the model takes {dtype} tokens")
    return x.astype(dtype)


def labels(path: str, key: str, y: np.ndarray, definition) -> np.ndarray:
    want = tuple(definition.label_shape)
    if y.ndim < 1 or tuple(y.shape[1:]) != want:
        raise UsageError(
            f"--data {path}: {key} has shape {list(y.shape)}; the model's labels are [N"
            + "".join(f", {size}" for size in want)
            + "]"
        )
    if y.dtype.kind not in "iu":
        raise UsageError(f"--data {path}: {key} is {y.dtype}; labels are integers (class indices)")
    if y.size and y.max() >= definition.classes:
        where = np.unravel_index(int(np.argmax(y)), y.shape)
        raise UsageError(
            f"--data {path}: {key} holds label {y.max()} (example {where[0]}); the model has {definition.classes} "
            f"classes, 0-{definition.classes - 1} (a negative label does not count)"
        )
    return y.astype(np.int64)
