"""A model that takes several named inputs (a Keras model of a dict or a list of `keras.Input`s): what each one
example's input is, and a batch of them as a dict {name: tensor [N, *shape]}, every input split alike on its first
axis. A model of one input (ModelDefinition.inputs empty) takes one tensor, as it always has.

    token_ids [16] int32 (vocabulary 50), padding_mask [16] int32

Its data is one array per input in an .npz, x_train_<name> and x_test_<name> (shared/training/npz_inputs.py).
"""

import dataclasses
from typing import Optional, Sequence, Tuple

import tensorflow as tf

from dtensor_vs_mirrored.shared.errors import UsageError

INPUT_DTYPES = ("float32", "int32", "int64")  # a float64 run widens float32 inputs; integers stay integers


@dataclasses.dataclass(frozen=True)
class NamedInput:
    name: str  # the key of its arrays (x_train_<name>) and of the batch's dict: the Keras Input's name or dict key
    shape: Tuple[int, ...]  # one example's, without the batch
    dtype: str  # one of INPUT_DTYPES
    # Token ids that feed an Embedding: its input_dim, the ids 0..vocabulary-1 the data is checked against. None: a
    # float input, or integers no Embedding takes (a 0/1 padding mask), checked only to be integers.
    vocabulary: Optional[int] = None

    def describe(self) -> str:
        vocabulary = f" (vocabulary {self.vocabulary})" if self.vocabulary is not None else ""
        return f"{self.name} [{', '.join(map(str, self.shape))}] {self.dtype}{vocabulary}"


def describe_inputs(inputs: Sequence[NamedInput]) -> str:
    return ", ".join(named.describe() for named in inputs)


def example_batch(definition, count: int):
    """Zeros of `count` examples as the forward takes them: one tensor, or a dict of one per named input."""
    if not definition.inputs:
        return tf.zeros((count, *definition.input_shape), definition.input_dtype)
    return zeros_for(definition.inputs, count)


def zeros_for(inputs: Sequence[NamedInput], count: int) -> dict:
    return {named.name: tf.zeros((count, *named.shape), named.dtype) for named in inputs}


def batch_spec(definition, count: Optional[int]):
    """The TensorSpec of a batch of `count` examples (None: any), or a dict of one per named input."""
    if not definition.inputs:
        return tf.TensorSpec((count, *definition.input_shape), definition.input_dtype)
    return {named.name: tf.TensorSpec((count, *named.shape), named.dtype) for named in definition.inputs}


def check_inputs(inputs: Sequence[NamedInput], source: str) -> None:
    """UsageError in one line, naming the input, for named inputs no trainer could feed."""
    names = [named.name for named in inputs]
    for named in inputs:
        if not named.name or names.count(named.name) > 1:
            raise UsageError(f"--model {source}: input name {named.name!r} is not one name; give each input its own")
        if not named.shape or not all(isinstance(size, int) and size > 0 for size in named.shape):
            raise UsageError(
                f"--model {source}: input {named.name} is [N, {', '.join(map(str, named.shape))}]; give every "
                f"dimension but the batch's a size (keras.Input(shape=(16,), name={named.name!r}))"
            )
        if named.dtype not in INPUT_DTYPES:
            raise UsageError(
                f"--model {source}: input {named.name} is {named.dtype}; use {', '.join(INPUT_DTYPES)} (a mask: "
                f"int32 0/1)"
            )
        if named.vocabulary is not None and (not named.dtype.startswith("int") or named.vocabulary < 1):
            raise UsageError(
                f"--model {source}: input {named.name} is {named.dtype} with vocabulary {named.vocabulary}; only "
                f"integer token ids have one, of 1 id or more"
            )
