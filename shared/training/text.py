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

from shared.errors import UsageError

EXCERPT = "training/embedded/tiny_shakespeare_excerpt.txt.gz"
TFDS_HOST = "raw.githubusercontent.com"  # where tensorflow-datasets downloads tiny_shakespeare from
DEFAULT_TRAIN, DEFAULT_TEST = 1024, 128  # sequences; the excerpt holds 3,072 and 384


def excerpt() -> Tuple[str, str]:
    """The shipped (train, test) texts."""
    with importlib.resources.files("shared").joinpath(EXCERPT).open("rb") as file:
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


def take(name: str, tokens, labels, requested: Optional[int], default: int, where: str):
    count = min(default, len(labels)) if requested is None else requested
    if count > len(labels):
        raise UsageError(
            f"--{name}-examples {count} is more than the {len(labels)} {name} sequences in {where}; "
            f"use --{name}-examples {len(labels)} or fewer"
        )
    return tokens[:count], labels[:count]
