"""One meaning per exit code: 2 is bad input in one line, 3 is compare.py's own failure in one line with the
traceback in a file; neither prints a traceback on the console (unless --verbose asks for it), and neither is 1,
which means parity failed. Each in this process but one, which runs as a command: ~2 s in all."""

import copy
import json
import os
import re
import subprocess
import sys
import tempfile

import pytest

from dtensor_vs_mirrored.shared.report.schema import SCHEMA_VERSION
from tests.cli import ROOT, run_here

INTERNAL = re.compile(r"^compare\.py: internal error: (\w+): (.*) \(traceback in (\S+)\)$")
RELEASE_BASELINE = os.path.join(ROOT, "release_matrix", "baseline-float64.json")


@pytest.fixture
def own_temp_dir(tmp_path, monkeypatch):
    """Where the traceback file goes (tempfile.gettempdir()): this test's directory."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def fail_inside(monkeypatch):
    """Make the run itself raise, past argument parsing, as a bug in compare.py would."""
    from dtensor_vs_mirrored.shared.run import comparison

    def broken(config):
        raise RuntimeError("forced for the test\nsecond line")

    monkeypatch.setattr(comparison, "run", broken)


def test_an_internal_error_is_exit_3_with_one_line_and_the_traceback_in_a_file(monkeypatch, own_temp_dir):
    fail_inside(monkeypatch)
    result = run_here("--trainers", "reference", "--data", "embedded")
    assert result.returncode == 3 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    match = INTERNAL.match(line)
    assert match and match.group(1, 2) == ("RuntimeError", "forced for the test"), line
    assert os.path.dirname(match.group(3)) == str(own_temp_dir)
    with open(match.group(3)) as file:
        kept = file.read()
    assert kept.startswith("compare.py --trainers reference --data embedded\n")
    assert "Traceback (most recent call last)" in kept and "RuntimeError: forced for the test" in kept


def test_verbose_shows_the_internal_errors_traceback_on_stderr_too(monkeypatch, own_temp_dir):
    fail_inside(monkeypatch)
    result = run_here("--trainers", "reference", "--data", "embedded", "--verbose")
    assert result.returncode == 3
    assert INTERNAL.match(result.stderr.splitlines()[0])
    assert "Traceback (most recent call last)" in result.stderr


# As a command, with descriptor 2 hidden as for a user (shared/console.py): the run breaks right after, before
# TensorFlow is imported (a second instead of ten).
BROKEN_COMMAND = """
import sys
from dtensor_vs_mirrored.shared import cli as compare
hide = compare.hide_tensorflow_messages
def hide_then_break(verbose):
    hide(verbose)
    raise KeyError("forced")
compare.hide_tensorflow_messages = hide_then_break
sys.exit(compare.main())
"""


def test_an_internal_error_from_the_command_is_one_line_and_exit_3(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    command = [sys.executable, "-c", BROKEN_COMMAND, "--trainers", "reference", "--data", "embedded"]
    done = subprocess.run(
        command, cwd=tmp_path, env=dict(env, PYTHONPATH=ROOT, TMPDIR=str(tmp_path)), capture_output=True, text=True
    )
    assert done.returncode == 3 and done.stdout == "", done.stderr[-3000:]
    (line,) = done.stderr.splitlines()
    match = INTERNAL.match(line)
    assert match and match.group(1, 2) == ("KeyError", "'forced'") and os.path.isfile(match.group(3)), line


# compare.main called twice by a Python caller, with descriptor 2 hidden as for a user: then the caller's own lines.
TWICE_THEN_THE_CALLERS = """
import contextlib, io, os, sys
from dtensor_vs_mirrored.shared import cli as compare
bad = ["--data", "embedded", "--train-examples", "5000"]
for _ in range(2):
    print(compare.main(bad), flush=True)
caught = io.StringIO()
with contextlib.redirect_stderr(caught):
    print(compare.main(bad), caught.getvalue().startswith("compare.py: error: --train-examples 5000"), flush=True)
print("the caller's line", file=sys.stderr, flush=True)
os.write(2, b"the caller's descriptor 2\\n")
raise RuntimeError("the caller's own error")
"""


def test_a_python_caller_keeps_its_stderr_after_main(tmp_path):
    """main puts descriptor 2 and sys.stderr back when it returns: the second call's error line shows, a third goes
    to the caller's io.StringIO, and the caller's lines and traceback after them show (all were lost before)."""
    done = python_script(TWICE_THEN_THE_CALLERS, tmp_path)
    stderr = done.stderr
    assert done.stdout.split() == ["2", "2", "2", "True"], stderr[-3000:]
    refused = "compare.py: error: --train-examples 5000 is more than"
    assert [line.startswith(refused) for line in stderr.splitlines()[:2]] == [True, True], stderr[-3000:]
    assert "the caller's line\nthe caller's descriptor 2\nTraceback (most recent call last)" in stderr
    assert stderr.rstrip().endswith("RuntimeError: the caller's own error")


# A log handler made while descriptor 2 is hidden (TensorFlow's, on its first warning) holds that sys.stderr: after
# restore its lines show, and never land in a file the caller opens next (on the descriptor number freed).
HANDLER_AFTER_RESTORE = """
import logging, sys
from dtensor_vs_mirrored.shared.console import hide_tensorflow_messages
restore = hide_tensorflow_messages(False, environ={})
handler = logging.StreamHandler(sys.stderr)
restore()
with open("caller.txt", "w") as caller:
    logging.getLogger("made while hidden").addHandler(handler)
    logging.getLogger("made while hidden").warning("a warning after restore")
print(open("caller.txt").read() == "", flush=True)
"""


# A caller's io.StringIO as sys.stderr while hidden: a trainer process started meanwhile still gets the original
# descriptor 2 (shared/run/worker.py starts them with shown_descriptor()), not /dev/null.
STRINGIO_WHILE_HIDDEN = """
import contextlib, io, os, subprocess, sys
from dtensor_vs_mirrored.shared.console import hide_tensorflow_messages, shown_descriptor
with contextlib.redirect_stderr(io.StringIO()):
    restore = hide_tensorflow_messages(False, environ={})
    child = [sys.executable, "-c", "import sys; sys.stderr.write('a trainer process line\\\\n')"]
    subprocess.run(child, stderr=shown_descriptor(), check=True)
    restore()
print(shown_descriptor() == 2, flush=True)
"""


def test_a_process_started_while_hidden_under_a_callers_stringio_shows_its_lines(tmp_path):
    done = python_script(STRINGIO_WHILE_HIDDEN, tmp_path)
    assert done.returncode == 0 and done.stdout == "True\n", done.stderr[-2000:]
    assert done.stderr == "a trainer process line\n"


def test_a_log_handler_made_while_hidden_writes_to_stderr_after_restore_not_into_a_callers_file(tmp_path):
    done = python_script(HANDLER_AFTER_RESTORE, tmp_path)
    assert done.returncode == 0 and done.stdout == "True\n", done.stderr[-2000:]
    assert done.stderr == "a warning after restore\n"


QUIET_CHECK = """
import sys
from dtensor_vs_mirrored.shared.api import check_model
print("the check's own line", file=sys.stderr)
check = check_model("mlp", meshes=["batch=2"], trainers=["dtensor"], devices=2, train_examples=256, test_examples=128,
                    epochs=1, verbose=VERBOSE)
print(check.ok)
"""


# extended: tests/test_quiet_check.py asks the same of check_model by default, where the user set the log level.
@pytest.mark.extended
def test_check_model_keeps_tensorflows_lines_out_of_the_callers_output_unless_verbose(tmp_path):
    """A user's test output holds their own lines: not TensorFlow's start-up lines (the import of shared.api starts
    it), nor DTensor's, nor TensorFlow's deprecation warnings; verbose=True shows TensorFlow's."""
    quiet = python_script(QUIET_CHECK.replace("VERBOSE", "False"), tmp_path)
    assert quiet.returncode == 0 and quiet.stdout == "True\n", quiet.stderr[-2000:]
    assert quiet.stderr == "the check's own line\n"
    shown = python_script(QUIET_CHECK.replace("VERBOSE", "True"), tmp_path)
    assert shown.returncode == 0 and "dtensor_device.cc" in shown.stderr, shown.stderr[-2000:]
    assert "tensor_shape_from_node_def_name" not in shown.stderr  # the profiler's deprecation: never the user's


def python_script(script: str, tmp_path) -> subprocess.CompletedProcess:
    """`python -c script` in `tmp_path`, the repository importable, with TensorFlow's lines hidden as for a user
    (no TF_CPP_MIN_LOG_LEVEL, which conftest sets for the test process)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=dict(env, PYTHONPATH=ROOT), capture_output=True, text=True
    )


def broken_baseline(tmp_path, break_it) -> str:
    with open(RELEASE_BASELINE) as file:
        report = json.load(file)
    report = copy.deepcopy(report)
    report["schema_version"] = SCHEMA_VERSION  # a report of this version, checked whole (the file is 2.3's)
    report["config"].update(fit=False, clip_global_norm=None)  # with the fields 2.5 added
    report["config"].update(sharded_forward="auto")  # and 2.6
    report["environment"]["keras"] = "3.15.1"
    break_it(report)
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(report))
    return str(path)


@pytest.mark.parametrize(
    "break_it, expected",
    [
        (
            lambda report: report["trainers"]["dtensor"].pop("step_losses"),
            f"not a report of schema {SCHEMA_VERSION} at trainers/dtensor: 'step_losses' is a required property; "
            f"save it again with this compare.py",
        ),
        (
            lambda report: report["trainers"]["mirrored"]["final_weights"][2].pop("sample_values"),
            f"not a report of schema {SCHEMA_VERSION} at trainers/mirrored/final_weights/2: 'sample_values' is a "
            f"required property",
        ),
        (
            lambda report: report["config"].update(epochs="2"),
            f"not a report of schema {SCHEMA_VERSION} at config/epochs: \"2\" is not of type 'integer'",
        ),
        (  # another minor: only what --baseline reads is required, and the types hold
            lambda report: report.update(schema_version="2.0") or report["trainers"]["dtensor"].pop("failed"),
            "not a report of schema 2.0 at trainers/dtensor: 'failed' is a required property",
        ),
    ],
    ids=["a trainer's losses removed", "a digest's field removed", "a number as text", "an older minor's"],
)
def test_a_broken_baseline_is_one_line_and_exit_2_before_anything_trains(tmp_path, break_it, expected):
    path = broken_baseline(tmp_path, break_it)
    result = run_here("--data", "embedded", "--baseline", path)
    assert result.returncode == 2 and "epoch 1/" not in result.stdout, result.stderr[-2000:]
    assert result.stderr.splitlines() == [result.stderr.splitlines()[0]]
    assert result.stderr.startswith(f"compare.py: error: --baseline {path}: {expected}"), result.stderr


def test_an_older_minors_baseline_without_the_newer_fields_is_read(tmp_path):
    """2.3 added config.dropout and parity first_difference; a 2.2 report without them is still a baseline."""
    from dtensor_vs_mirrored.shared.report.saved import load

    def as_2_2(report):
        report.update(schema_version="2.2")
        del report["config"]["dropout"], report["config"]["replay_step"], report["compute"]

    assert load(broken_baseline(tmp_path, as_2_2))["schema_version"] == "2.2"


@pytest.mark.parametrize(
    "contents, expected",
    [
        (None, r"--client-config \S+: cannot read it \(No such file or directory\); it is the file that the "),
        ("{", r"--client-config \S+: not a configuration in JSON \(Expecting property name"),
        ('{"devices": 2}', r"--client-config \S+: not what the --clients launcher writes \(its config and result_"),
        (
            '{"config": {"devices": 2, "mystery": 1}, "result_file": "r.pkl"}',
            r"--client-config \S+: unknown configuration field 'mystery'; it was written",
        ),
        (
            '{"config": {"devices": "2"}, "result_file": "r.pkl"}',
            r"--client-config \S+: configuration field 'devices' is '2', not a value that field",
        ),
    ],
    ids=["missing", "not JSON", "a bare config", "an unknown field", "a wrong type"],
)
def test_a_bad_client_config_is_one_line_and_exit_2(tmp_path, contents, expected):
    path = tmp_path / "client.json"
    if contents is not None:
        path.write_text(contents)
    result = run_here("--client-config", path)
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = result.stderr.splitlines()
    assert re.match(r"compare\.py: error: " + expected, line), line


def test_a_failure_is_one_line_that_names_the_error_even_where_tensorflow_traced_it():
    """A trainer's FAILED reason (shared/errors.py one_line): the error's first line and where it was raised; for
    an error raised while TensorFlow traced a function, the traced error and its frame, not "in user code:"."""
    import tensorflow as tf

    from dtensor_vs_mirrored.shared.errors import one_line

    @tf.function
    def grows():
        x = tf.zeros([2])
        for _ in tf.range(3):
            x = tf.concat([x, [1.0]], 0)  # a loop variable that changes shape: autograph refuses it when traced
        return x

    with pytest.raises(ValueError, match="^in user code:") as raised:
        grows()
    traced = one_line(raised.value)
    line = grows.python_function.__code__.co_firstlineno + 3  # the loop's line, which autograph names
    assert re.fullmatch(rf"ValueError: 'x' has shape \(2,\) before the loop, .* \(test_exit_codes\.py:{line}\)", traced)

    def plain():
        return {}["b"]

    with pytest.raises(KeyError) as raised:
        plain()
    assert one_line(raised.value) == f"KeyError: 'b' (test_exit_codes.py:{plain.__code__.co_firstlineno + 1})"

    def in_tensorflow():
        return tf.reshape(tf.zeros([2]), [3])  # raised in TensorFlow's files: named at this line, not theirs

    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        in_tensorflow()
    named = one_line(raised.value)
    assert named.startswith("InvalidArgumentError: ") and "[Op:" not in named, named
    assert named.endswith(f"(test_exit_codes.py:{in_tensorflow.__code__.co_firstlineno + 1})"), named
