"""tiny Shakespeare as character sequences: the GPT's data (shared/model/gpt.py).

Sources (`--data` with `--model gpt`):
  tfds      tensorflow-datasets' tiny_shakespeare: its train and test texts (90% and the last 5% of the text)
  embedded  an excerpt shipped in this package (shared/training/embedded/tiny_shakespeare_excerpt.txt.gz):
            the first 199,680 characters of that train text and the first 24,960 of its test text
  auto      tfds if it is prepared locally or its download host answers within a few seconds, else embedded

Each text is cut into consecutive, non-overlapping windows of 65 characters, from its first character
on: an example is a window's first 64 characters as tokens and its last 64 as labels (the next character
at each position). No randomness: the same windows on every machine.
"""

import gzip
import importlib.resources
from typing import Optional, Tuple

import numpy as np

from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.model.gpt import VOCABULARY
from dtensor_vs_mirrored.shared.training.dataset import Dataset, host_answers, take

EXCERPT = "embedded/tiny_shakespeare_excerpt.txt.gz"  # beside this module
TFDS_HOST = "raw.githubusercontent.com"  # where tensorflow-datasets downloads tiny_shakespeare from
DEFAULT_TRAIN, DEFAULT_TEST = 1024, 128  # sequences; the excerpt holds 3,071 and 383


def excerpt() -> Tuple[str, str]:
    """The shipped (train, test) texts."""
    with importlib.resources.files(__package__).joinpath(EXCERPT).open("rb") as file:
        text = gzip.decompress(file.read()).decode("utf-8")
    train_length, test_length, rest = text.split("\n", 2)
    return rest[: int(train_length)], rest[int(train_length) : int(train_length) + int(test_length)]


def windows(text: str, vocabulary: str, context: int) -> Tuple[np.ndarray, np.ndarray]:
    """(tokens [N, context] int32, next-character labels [N, context] int64) from consecutive windows."""
    index = {character: token for token, character in enumerate(vocabulary)}
    unknown = sorted(set(text) - set(index))
    if unknown:
        raise UsageError(f"the text has characters the model's vocabulary lacks: {''.join(unknown)!r}")
    codes = np.array([index[character] for character in text], np.int64)
    count = (len(codes) - 1) // (context + 1) if len(codes) > context else 0
    cut = codes[: count * (context + 1)].reshape(count, context + 1)
    return cut[:, :-1].astype(np.int32), cut[:, 1:]


def tfds_availability() -> Tuple[bool, str]:
    """Whether tensorflow-datasets' tiny_shakespeare can load without an offline retry, and why."""
    try:
        import tensorflow_datasets as tfds

        builder = tfds.builder("tiny_shakespeare")
    except Exception as error:  # noqa: BLE001 - a broken install: one reason, and --data auto falls back
        return False, f"tensorflow_datasets does not work here ({type(error).__name__}: {error})"
    if builder.is_prepared():
        return True, f"tiny_shakespeare is prepared in {builder.data_dir}"
    if host_answers(TFDS_HOST):
        return True, f"tiny_shakespeare is not prepared locally but {TFDS_HOST} answers; downloading"
    return False, f"tiny_shakespeare is not prepared in {builder.data_dir} and {TFDS_HOST} did not answer"


def tfds_texts() -> Tuple[str, str]:
    import tensorflow_datasets as tfds

    train, test = tfds.as_numpy(tfds.load("tiny_shakespeare", split=["train", "test"], batch_size=-1))
    return train["text"][0].decode("utf-8"), test["text"][0].decode("utf-8")


def load(source: str, definition, train_examples: Optional[int], test_examples: Optional[int]) -> Dataset:
    """tiny Shakespeare's windows for a character model (ModelDefinition) of VOCABULARY's characters."""
    vocabulary = definition.vocabulary or 0
    if min(definition.classes, vocabulary) < len(VOCABULARY) or len(definition.input_shape) != 1:
        raise UsageError(
            f"model {definition.name}: tiny Shakespeare is {len(VOCABULARY)} characters (shared.model.gpt.VOCABULARY) "
            f"in sequences [N, T]; the model takes {list(definition.input_shape)} of vocabulary {vocabulary} and "
            f"{definition.classes} classes"
        )
    fallback = ""
    if source == "embedded":
        (train, test), origin, reason = excerpt(), "embedded", "--data embedded"
    elif source in ("tfds", "auto"):
        available, why = tfds_availability()
        if available:
            (train, test), origin, reason = tfds_texts(), "tfds", why
        elif source == "tfds":
            raise UsageError(f"--data tfds: {why}; use --data embedded, or your own sequences as --data FILE.npz")
        else:
            (train, test), origin, reason, fallback = excerpt(), "embedded", f"auto: {why}", why
    else:
        raise UsageError(
            f"--data {source}: model {definition.name} trains on tiny Shakespeare (auto, tfds or embedded) "
            f"or on your sequences as --data FILE.npz"
        )
    context = definition.input_shape[0]
    where = f"{origin} tiny Shakespeare"
    x_train, y_train = take("train", *windows(train, VOCABULARY, context), train_examples, DEFAULT_TRAIN, where)
    x_test, y_test = take("test", *windows(test, VOCABULARY, context), test_examples, DEFAULT_TEST, where)
    x_train, x_test = x_train.astype(definition.input_dtype), x_test.astype(definition.input_dtype)
    # source: what --data names (a --clients launch passes it on); the reason says which text
    return Dataset(x_train, y_train, x_test, y_test, origin, f"tiny Shakespeare; {reason}", fallback)
