"""What a run prints: the project's own lines, within LINE_WIDTH, and TensorFlow's only when asked for.

TensorFlow's C++ runtime writes its start-up and per-trace messages (oneDNN, CUDA
drivers, cuInit, the XLA service, one "DTensor cache key lookup missed" per trace)
straight to file descriptor 2, and on TensorFlow 2.21 those before absl's logging
starts ignore TF_CPP_MIN_LOG_LEVEL. So `hide_tensorflow_messages` points descriptor 2
at /dev/null and gives Python's `sys.stderr` a copy of the original (a caller's
io.StringIO stays): the project's error lines, a traceback and the progress bar still
show. The command line keeps it so to its exit; `main` (shared/cli.py) called from Python puts
everything back when it returns. Nothing is hidden with --verbose, or when the user has
set TF_CPP_MIN_LOG_LEVEL (they chose what TensorFlow prints). Cost: a crash inside
TensorFlow's C++ (an abort) then prints nothing of its own; rerun with --verbose to see it.
"""

import logging
import os
import sys
import textwrap
import threading
from typing import Callable, Optional

TF_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
# A normal terminal's width: the tables are built to fit it, and longer lines are broken at spaces.
LINE_WIDTH = 120
LOG_INDENT = 11  # continuation lines start under the text after "dtensor    ", the trainer's name padded to 10


def fit_width(text: str, indent: int = LOG_INDENT, width: int = LINE_WIDTH) -> str:
    """Each line of `text` broken at spaces into lines of at most `width` characters, the continuations
    indented by `indent`; a line within `width` comes back unchanged, and so does one long word."""
    return "\n".join(
        line
        if len(line) <= width
        else textwrap.fill(
            line, width=width, subsequent_indent=" " * indent, break_long_words=False, break_on_hyphens=False
        )
        for line in text.split("\n")
    )


# What the process is doing, for a trainer process's parent (shared/run/worker.py) to name if it dies; None: unsent.
status_sink = None


def status(text: str) -> None:
    """Say what this process is doing now, e.g. "mesh batch=8 over 8 x CPU: tracing the first train step"."""
    if status_sink is not None:
        status_sink(text)


_printing = threading.Lock()  # the reference prints here while the lanes' threads print their trainers' lines


def print_fitted(text: str) -> None:
    """The trainers' and the comparison's `log`: print, within LINE_WIDTH, a whole line at a time."""
    with _printing:
        print(fit_width(text))


def hide_tensorflow_messages(verbose: bool, environ=os.environ) -> Callable[[], None]:
    """Hide everything written to descriptor 2 except through sys.stderr; returns what puts descriptor 2, sys.stderr
    and the loggers' levels back (cli.main does for a Python caller; nothing to do where nothing was hidden). A
    sys.stderr that is not descriptor 2 (a caller's io.StringIO) is kept: the lines go there, and a trainer process
    started meanwhile gets the original descriptor 2 (shown_descriptor).

    Call it before TensorFlow is imported: its first messages come with the import.
    """
    global _shown_descriptor
    if verbose or TF_LOG_LEVEL in environ:
        return lambda: None
    sys.stderr.flush()
    shown, levels = sys.stderr, {name: logging.getLogger(name).level for name in ("tensorflow", "absl")}
    original = _shown_descriptor = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    # The copy owns the descriptor: a log handler made meanwhile (TensorFlow's, on its first warning) keeps writing
    # to it after restore, never to a descriptor closed and reused.
    copy = os.fdopen(original, "w", buffering=1) if _descriptor(shown) == 2 else None  # line-buffered, as a terminal
    if copy is not None:
        sys.stderr = copy
    # TensorFlow's Python-side logging (absl) writes through sys.stderr: errors only.
    for name in levels:
        logging.getLogger(name).setLevel(logging.ERROR)

    def restore() -> None:
        global _shown_descriptor
        sys.stderr.flush()
        os.dup2(original, 2)
        if copy is None:
            os.close(original)
        sys.stderr, _shown_descriptor = shown, None
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)

    return restore


_shown_descriptor = None  # while hide_tensorflow_messages hides descriptor 2: a copy of the original


def shown_descriptor() -> Optional[int]:
    """Where a trainer process's own lines go (shared/run/worker.py): while descriptor 2 is hidden, the original's
    copy (sys.stderr's, or where sys.stderr is a caller's io.StringIO the copy kept for this); else sys.stderr's
    descriptor; None where it has none (the process then inherits descriptor 2)."""
    return _descriptor(sys.stderr) if _shown_descriptor is None else _shown_descriptor


def _descriptor(stream) -> Optional[int]:
    """The stream's file descriptor; None where it has none (an io.StringIO)."""
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return None
