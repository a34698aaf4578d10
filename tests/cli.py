"""Run compare.py in a subprocess, as a user would; every --json report it writes is checked against the schema."""

import json
import os
import re
import struct
import subprocess
import sys

import jsonschema

from shared.report_schema import SCHEMA_PATH

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A compare.py run of a few seconds' training: 4 steps of 64 embedded examples on 2 devices.
SMALL = ["--data", "embedded", "--train-examples", "256", "--test-examples", "128", "--epochs", "1"]
SMALL += ["--devices", "2", "--batch-size", "64"]
PNG_SIZE = (900, 600)  # shared/plots.py's FIGURE_SIZE (9, 6) at 100 dpi
with open(SCHEMA_PATH) as _file:
    REPORT_VALIDATOR = jsonschema.Draft202012Validator(json.load(_file))


def check_report(report: dict) -> dict:
    """`report` if it validates against shared/report.schema.json; else the first error, with its path."""
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
    """compare.py's exit code and output; TensorFlow's own messages hidden as for a user
    (conftest sets TF_CPP_MIN_LOG_LEVEL for this process, which would show them). A report that
    --json wrote (new or changed) must validate against the schema."""
    env = dict({k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}, PYTHONPATH=ROOT, **(env or {}))
    report_path = args[args.index("--json") + 1] if "--json" in args else None
    before = _contents(report_path)
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "compare.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
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


def run_main(argv, capsys):
    """compare.main(argv) in this process (TensorFlow and the 8 test devices already set up, so a
    bad input is judged in a second, not the 8 s a new process takes to import TensorFlow):
    (exit code, stdout, stderr). A traceback would propagate and fail the test."""
    import compare

    capsys.readouterr()  # what came before is not this run's
    code = compare.main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def png_size(path):
    """(width, height) of a PNG file, read from its header."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])
