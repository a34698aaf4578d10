"""`--data FILE.npz` for a model of several named inputs (shared/model/named_inputs.py): one array per input and
split, x_train_<name> and x_test_<name>, beside y_train and y_test; every input of a split has its examples on the
first axis, as many as its labels. Each input is checked as one input is (shared/training/npz.py: its shape, dtype,
finite floats, token ids within the vocabulary of the Embedding they feed); an integer input that feeds no Embedding
(a 0/1 padding mask) is checked to be integers (bool is taken as 0/1).

    np.savez("tokens.npz", x_train_token_ids=ids, x_train_padding_mask=mask, y_train=labels, ...)
"""

import dataclasses
from typing import List, Optional

import numpy as np

from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.training import npz
from dtensor_vs_mirrored.shared.training.dataset import Dataset, example_count


def keys(definition) -> List[str]:
    """The arrays a model of several inputs needs, in the order a message lists them."""
    names = [named.name for named in definition.inputs]
    return [f"x_{split}_{name}" for split in ("train", "test") for name in names] + ["y_train", "y_test"]


def needs(definition) -> str:
    """What a message says the file must hold."""
    names = ", ".join(named.name for named in definition.inputs)
    return f"{', '.join(keys(definition))} (one array per input of the model: {names})"


def refuse_other_data(source: str, definition) -> None:
    """A model of several inputs takes its data from an .npz only: MNIST and tiny Shakespeare are one input."""
    raise UsageError(
        f"--data {source}: the model takes {len(definition.inputs)} inputs, which only an .npz gives; use --data "
        f"FILE.npz holding {needs(definition)} (docs/data.md)"
    )


def load(path: str, definition, train_examples: Optional[int], test_examples: Optional[int], dtype: str) -> Dataset:
    """The file's arrays for the model's named inputs in a run of `dtype`, cut to the requested counts."""
    arrays = npz.read(path, keys(definition), needs(definition))
    splits, narrowed = [], False
    for split, requested in (("train", train_examples), ("test", test_examples)):
        x = {}
        for named in definition.inputs:
            key = f"x_{split}_{named.name}"
            x[named.name] = input_array(path, key, arrays[key], named, definition, dtype)
            narrowed = narrowed or (arrays[key].dtype == np.float64 and x[named.name].dtype == np.float32)
        y = npz.labels(path, f"y_{split}", arrays[f"y_{split}"], definition, dtype)
        check_examples(path, split, x, len(y))
        count = example_count(split, requested, len(y), len(y), path)
        x, y = {name: array[:count] for name, array in x.items()}, y[:count]
        npz.check_counted(path, split, y, definition)
        splits += [x, y]
    reason = "your arrays" + (f"; float64 inputs narrowed to float32 for this {dtype} run" if narrowed else "")
    return Dataset(*splits, path, reason)


def input_array(path: str, key: str, x: np.ndarray, named, definition, run_dtype: str) -> np.ndarray:
    """One input's array, checked as a model of that one input checks its x (npz.inputs); integers that feed no
    Embedding (a mask) only to be integers of its shape."""
    if named.dtype.startswith("int") and named.vocabulary is None:
        want = tuple(named.shape)
        if x.ndim < 1 or tuple(x.shape[1:]) != want:
            raise UsageError(
                f"--data {path}: {key} has shape {list(x.shape)}; the model's input {named.name} is "
                f"[N, {', '.join(map(str, want))}]"
            )
        if x.dtype.kind not in "iub":
            raise UsageError(f"--data {path}: {key} is {x.dtype}; the model's input {named.name} takes {named.dtype}")
        return x.astype(named.dtype)
    one = dataclasses.replace(
        definition, input_shape=named.shape, input_dtype=named.dtype, vocabulary=named.vocabulary, inputs=()
    )
    return npz.inputs(path, key, x, one, run_dtype)


def check_examples(path: str, split: str, x: dict, labels: int) -> None:
    """Every input of a split has one example per label on its first axis."""
    for name, array in x.items():
        if len(array) != labels:
            raise UsageError(
                f"--data {path}: x_{split}_{name} has {len(array)} examples but y_{split} has {labels}; give every "
                f"input of the split one example per label, on its first axis"
            )
