"""The project's error type: bad input that the user can fix; and any error as one line (`one_line`).

Every check that rejects a flag, a file or a device request raises `UsageError`
with one line that names the value and says what would work; `compare.py`
prints that line and exits with code 2, without a traceback.
"""

import os
import re
import traceback
from typing import Callable, Optional

# What TensorFlow wraps an op's error in: its function's name before, the op's after.
TENSORFLOW_WRAPPING = re.compile(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\].*$")
# An error raised while TensorFlow traced a function: this line, the traced frames, then the error's own lines.
TRACED = "in user code:"
TRACED_FRAME = re.compile(r'^File "([^"]+)", line (\d+)')
ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*: ")
# How the data's reason starts when tensorflow_datasets fails to load (shared/training/data.py); the release table
# (release_matrix/table.py, the standard library alone) finds it in a report.
TFDS_BROKEN = "tensorflow_datasets does not work here"


class UsageError(Exception):
    """Bad input; the message is one line that says what to fix. `field`: the Config field it is about, when the
    message is that option's alone (`0 is not a positive integer`): each front end names the option its way,
    `argument --train-examples: ...` here (str) and on the command line, `argument train_examples: ...` in
    check_model (shared/api.py). Without a field the message names its options itself, as compare.py's flags."""

    def __init__(self, message: str, field: Optional[str] = None):
        super().__init__(message, field)
        self.message, self.field = message, field

    def __str__(self) -> str:
        return f"argument {flag(self.field)}: {self.message}" if self.field else self.message


def flag(field: str) -> str:
    """The compare.py flag of Config field `field`; a switch whose flag negates it (--no-timing) has its own
    (shared.config.option_flag) and is never a UsageError's field."""
    return "--" + field.replace("_", "-")


def installed(filename: str) -> bool:
    """A frame of an installed package (TensorFlow, Keras, NumPy), not of this project or the user's files."""
    parts = os.path.normpath(filename).split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts


def one_line(error: BaseException, counts: Callable[[str], bool] = lambda filename: not installed(filename)) -> str:
    """`Type: first line (file:line)`, at the innermost frame whose file `counts` (by default the innermost outside
    installed packages: the project's or the user's line, not TensorFlow's; the innermost of all if none).

    An error raised while TensorFlow traced a function says only "in user code:" on its first line, and its
    own frames are TensorFlow's and autograph's generated files: it is named by the traced error's line (e.g.
    "ValueError: 'first' has shape (28, 32) before the loop, ...") at the innermost traced frame."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    frames = [(frame.filename, frame.lineno) for frame in traceback.extract_tb(error.__traceback__)]
    message = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    if lines and lines[0] == TRACED:
        traced = [(index, found.groups()) for index, found in enumerate(map(TRACED_FRAME.match, lines)) if found]
        frames += [frame for _, frame in traced]
        after = lines[traced[-1][0] + 1 :] if traced else lines[1:]
        own = [line for line in after if ERROR_LINE.match(line)]
        message = own[0] if own else f"{type(error).__name__}: {after[-1] if after else ''}"
    message = TENSORFLOW_WRAPPING.sub("", message).strip()
    where = ([frame for frame in frames if counts(frame[0])] or frames or [None])[-1]
    return message + (f" ({os.path.basename(where[0])}:{where[1]})" if where else "")
