"""check_model in a user's pytest prints none of TensorFlow's lines and no warning unless verbose=True: not its
C++ start-up (I0000 oneDNN, E0000 cuInit), even where the user set TF_CPP_MIN_LOG_LEVEL, and not the deprecation
warning of the v1 profiler that counts a Keras model's float operations. Each check runs in a process of its own,
where TensorFlow starts: a few seconds each (a two-layer Keras model, 64 examples, one epoch, in that process)."""

import os
import subprocess
import sys

import pytest

from tests.cli import ROOT

pytest.importorskip("keras", minversion="3", reason="a Keras model needs Keras 3")

CHECK = """
import sys
from dtensor_vs_mirrored.shared.api import check_model


def small():
    import keras

    inputs = keras.Input((784,))
    hidden = keras.layers.Dense(16, activation="relu", name="dense")(inputs)
    return keras.Model(inputs, keras.layers.Dense(10, name="out")(hidden))


result = check_model(small, meshes=("batch=2",), devices=2, epochs=1, train_examples=64, test_examples=32,
                     batch_size=32, verbose=sys.argv[1] == "verbose")
print("verdicts", sorted(verdict.verdict for verdict in result.verdicts.values()))
"""
TENSORFLOW_LINES = ("I0000", "W0000", "E0000", "cuInit", "oneDNN", "DeprecationWarning", "is deprecated")


def checked(tmp_path, mode: str, **environment) -> str:
    env = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-c", CHECK, mode],
        cwd=tmp_path,
        env=dict(env, PYTHONPATH=ROOT, **environment),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "verdicts ['ok', 'ok']" in done.stdout
    return done.stdout + done.stderr


def test_check_model_prints_no_tensorflow_line_and_no_warning_where_the_user_set_the_log_level(tmp_path):
    output = checked(tmp_path, "quiet", TF_CPP_MIN_LOG_LEVEL="0")  # the user set it: check_model hides them still
    assert [marker for marker in TENSORFLOW_LINES if marker in output] == [], output


@pytest.mark.extended  # a second check_model process for verbose=True; the quiet default: the test above
def test_verbose_shows_tensorflows_lines_but_not_the_profilers_deprecation(tmp_path):
    output = checked(tmp_path, "verbose")
    assert "cuInit" in output or "I0000" in output, output
    assert "tensor_shape_from_node_def_name" not in output, output


def test_only_the_profilers_deprecation_is_dropped_and_only_during_the_count(caplog):
    import logging

    from dtensor_vs_mirrored.shared.model.quiet_profiler import profiler_deprecations_dropped

    logger = logging.getLogger("tensorflow")
    with caplog.at_level(logging.WARNING, logger="tensorflow"), profiler_deprecations_dropped():
        logger.warning("tensor_shape_from_node_def_name (from graph_util_impl) is deprecated")
        logger.warning("a warning about your model")
    logger.warning("tensor_shape_from_node_def_name after the count")
    assert [record.getMessage() for record in caplog.records] == [
        "a warning about your model",
        "tensor_shape_from_node_def_name after the count",
    ]
