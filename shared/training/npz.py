"""`--data FILE.npz`: your own arrays, checked against the model's spec before anything trains.

The file holds x_train, y_train, x_test and y_test: inputs [N, *input_shape] (float inputs as float32 or
float64, token inputs as integers 0 to the model's vocabulary - 1) and labels [N, *label_shape] as integers,
0 to classes - 1, or negative for a label that does not count (a padded position); each split needs one that
counts. A model of "binary" or "values" targets (a compiled Keras regression or binary classifier) takes labels
of its output's shape instead ([N] for one unit too): finite numbers, 0 to 1 for binary ones. float64 inputs and
targets stay float64 in a float64 run and are narrowed in a float32 run, which the data's reason (the header's
data line) says. Anything else is one line naming the array; numbers only: a file
of pickled objects is refused, never loaded.
"""

import os
import zipfile
from typing import Optional

import numpy as np

from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.training.dataset import Dataset, take

KEYS = ("x_train", "y_train", "x_test", "y_test")


ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # numpy.savez writes a zip archive (the second: an empty one)


def load(
    path: str, definition, train_examples: Optional[int], test_examples: Optional[int], dtype: str = "float32"
) -> Dataset:
    """The file's arrays for `definition` (ModelDefinition) in a run of `dtype`, cut to the requested counts."""
    arrays = read(path)
    splits, narrowed = [], False
    for split, requested in (("train", train_examples), ("test", test_examples)):
        x = inputs(path, f"x_{split}", arrays[f"x_{split}"], definition, dtype)
        narrowed = narrowed or (arrays[f"x_{split}"].dtype == np.float64 and x.dtype == np.float32)
        y = labels(path, f"y_{split}", arrays[f"y_{split}"], definition, dtype)
        if len(x) != len(y):
            raise UsageError(f"--data {path}: x_{split} has {len(x)} examples but y_{split} has {len(y)}")
        x, y = take(split, x, y, requested, len(y), path)
        check_counted(path, split, y, definition)
        splits += [x, y]
    reason = "your arrays" + (f"; float64 inputs narrowed to float32 for this {dtype} run" if narrowed else "")
    return Dataset(*splits, path, reason)


def check_counted(path: str, split: str, y: np.ndarray, definition) -> None:
    """A split's class labels have one that counts: its mean loss divides by their count."""
    if y.dtype.kind != "f" and not (y >= 0).any():
        raise UsageError(
            f"--data {path}: no label of the {len(y)} y_{split} examples used counts (each is negative), so "
            f"its mean loss would divide by zero; give the split labels 0-{definition.classes - 1}"
        )


def read(path: str, keys=KEYS, needs: str = "") -> dict:
    """The arrays `keys` (needs: how a message lists them), numbers only: an object array would unpickle, which a
    file from elsewhere must not do."""
    needs = needs or ", ".join(keys)
    if not os.path.isfile(path):
        raise UsageError(f"--data {path}: no such file; give an .npz with arrays {needs}")
    try:
        with open(path, "rb") as file:
            start = file.read(4)
    except OSError as error:
        raise UsageError(f"--data {path}: cannot read it ({error.strerror}); fix its permissions") from None
    if start not in ZIP_MAGIC:
        kind = "one .npy array" if start.startswith(b"\x93NUM") else "not an .npz archive"
        raise UsageError(f"--data {path}: {kind}; write {needs} into one file with numpy.savez")
    try:
        with np.load(path, allow_pickle=False) as file:
            missing = [key for key in keys if key not in file.files]
            if missing:
                raise UsageError(
                    f"--data {path}: no array {missing[0]}; the file holds {', '.join(file.files) or 'none'} "
                    f"and needs {needs}"
                )
            arrays = {}
            for key in keys:
                try:
                    arrays[key] = file[key]
                except ValueError:  # numpy's message would suggest loading the pickle anyway
                    raise UsageError(
                        f"--data {path}: {key} holds Python objects, not numbers; save it as a numeric array"
                    ) from None
    except (OSError, zipfile.BadZipFile, EOFError) as error:
        raise UsageError(f"--data {path}: cannot read it as .npz ({error}); write it with numpy.savez") from None
    return arrays


def inputs(path: str, key: str, x: np.ndarray, definition, run_dtype: str = "float32") -> np.ndarray:
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
        return x if x.dtype == np.float64 and run_dtype == "float64" else x.astype(np.float32)
    if x.dtype.kind not in "iu":
        raise UsageError(f"--data {path}: {key} is {x.dtype}; the model takes {dtype} tokens")
    outside = np.flatnonzero(((x < 0) | (x >= definition.vocabulary)).reshape(len(x), -1).any(axis=1))
    if outside.size:
        token = x[outside[0]][(x[outside[0]] < 0) | (x[outside[0]] >= definition.vocabulary)].flat[0]
        raise UsageError(
            f"--data {path}: {key} holds token {token} (example {outside[0]}); the model's vocabulary is "
            f"{definition.vocabulary} tokens, 0-{definition.vocabulary - 1}"
        )
    return x.astype(dtype)


def labels(path: str, key: str, y: np.ndarray, definition, run_dtype: str = "float32") -> np.ndarray:
    """The labels as the model's targets take them: class ids, or (binary, values) floats of its output's shape."""
    if getattr(definition, "targets", "classes") != "classes":
        return targets(path, key, y, definition, run_dtype)
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


def targets(path: str, key: str, y: np.ndarray, definition, run_dtype: str) -> np.ndarray:
    """Binary or float targets of the output's shape ([N] for one unit), finite, 0 to 1 where binary; float64
    kept in a float64 run, float32 otherwise."""
    want = tuple(definition.label_shape)
    what = "0/1 labels" if definition.targets == "binary" else "float targets"
    expects = f"the loss {definition.loss_name} takes {what} of the output's shape [N, {', '.join(map(str, want))}]"
    if want == (1,) and y.ndim == 1:
        y = y.reshape(-1, 1)
    if y.ndim < 1 or tuple(y.shape[1:]) != want:
        raise UsageError(f"--data {path}: {key} has shape {list(y.shape)}; {expects}")
    if y.dtype.kind not in "iufb":
        raise UsageError(f"--data {path}: {key} is {y.dtype}; {expects}")
    flat = y.reshape(len(y), -1).astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(flat).all(axis=1))
    if bad.size:
        raise UsageError(f"--data {path}: {key} holds NaN or inf, first in example {bad[0]}; {expects}")
    outside = np.flatnonzero(((flat < 0) | (flat > 1)).any(axis=1)) if definition.targets == "binary" else []
    if len(outside):
        value = flat[outside[0]][(flat[outside[0]] < 0) | (flat[outside[0]] > 1)][0]
        raise UsageError(f"--data {path}: {key} holds {value:g} (example {outside[0]}); {expects}, each 0 to 1")
    return y.astype(np.float64 if y.dtype == np.float64 and run_dtype == "float64" else np.float32)
