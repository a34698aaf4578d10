"""Run compare.py as a user would (run_compare: a new process) or through compare.main in this one (run_here);
every --json report it writes is checked against the schema."""

import contextlib
import io
import json
import os
import re
import struct
import subprocess
import sys

import jsonschema

from dtensor_vs_mirrored.shared.report.schema import SCHEMA_PATH

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A compare.py run of a few seconds' training: 4 steps of 64 embedded examples on 2 devices, every trainer in the
# test's process (a trainer process of their own is the default's subject: test_compare.py's full run,
# tests/test_user_models.py's crash).
SMALL = ["--data", "embedded", "--train-examples", "256", "--test-examples", "128", "--epochs", "1"]
SMALL += ["--devices", "2", "--batch-size", "64", "--trainer-process", "shared", "--no-timing"]  # timed: test_compare
PNG_SIZE = (900, 600)  # shared/report/plots.py's FIGURE_SIZE (9, 6) at 100 dpi
with open(SCHEMA_PATH) as _file:
    REPORT_VALIDATOR = jsonschema.Draft202012Validator(json.load(_file))


def check_report(report: dict) -> dict:
    """`report` if it validates against shared/report/report.schema.json; else the first error, with its path."""
    error = jsonschema.exceptions.best_match(REPORT_VALIDATOR.iter_errors(report))
    if error is not None:
        raise AssertionError(
            f"the report does not match the schema at {'/'.join(map(str, error.absolute_path))}: {error.message[:500]}"
        )
    return report


def read_report(path) -> dict:
    with open(path) as file:
        return check_report(json.load(file))


def run_compare(*args, timeout=300, env=None):
    """compare.py's exit code and output from a new process, as a user runs it; TensorFlow's own messages
    hidden as for a user (conftest sets TF_CPP_MIN_LOG_LEVEL for this process, which would show them).
    For what needs a process of its own: an environment variable read when TensorFlow starts, op
    determinism (process-wide), TensorFlow's log lines, the command line itself; else run_here."""
    env = dict({k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}, PYTHONPATH=ROOT, **(env or {}))
    command = [sys.executable, os.path.join(ROOT, "compare.py"), *map(str, args)]
    return _checked(
        args, lambda: subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    )


def run_here(*args):
    """compare.main(args) in this process, returning what run_compare does: TensorFlow and the 8 test
    devices are set up already and autograph has converted the trainers' functions, so a small run
    takes a third of a new process's time (which spends 8 s importing TensorFlow). A traceback
    propagates and fails the test."""
    from dtensor_vs_mirrored.shared import cli as compare

    def run():
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = compare.main([str(arg) for arg in args])
        return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())

    return _checked(args, run)


def _checked(args, run):
    """run()'s result, once a report that --json wrote (new or changed) validates against the schema."""
    report_path = str(args[args.index("--json") + 1]) if "--json" in args else None
    before = _contents(report_path)
    done = run()
    if report_path is not None and _contents(report_path) not in (None, before):
        read_report(report_path)
    return done


def _contents(path):
    if path is None or not os.path.isfile(path):
        return None
    with open(path, "rb") as file:
        return file.read()


def unwrapped(text: str) -> str:
    """compare.py's output with each log line that shared.console.fit_width broke (a long path, say)
    joined again: a continuation starts with LOG_INDENT spaces."""
    return re.sub(r"\n {11}(?=\S)", " ", text)


def png_size(path):
    """(width, height) of a PNG file, read from its header."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def data_slice(data, train_examples: int, test_examples: int):
    """The first examples of each split of `data` (a shared.training.data.Dataset): a test's small data."""
    import dataclasses

    return dataclasses.replace(
        data,
        x_train=data.x_train[:train_examples],
        y_train=data.y_train[:train_examples],
        x_test=data.x_test[:test_examples],
        y_test=data.y_test[:test_examples],
    )
