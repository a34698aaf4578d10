"""Ctrl-C: compare.py stops every process it started at once (trainer processes, --clients' clients: each in a
session of its own, so a terminal's Ctrl-C reaches the run alone; shared/run/children.py), prints one line and exits
130, for a plain run, a sweep and --clients; check_model raises KeyboardInterrupt to its caller after the same
clean-up. Each runs in a new process interrupted mid-training: ~20 s."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cli import ROOT
from tests.processes import alive, children

# The run would train for minutes: the interrupt comes in its first epochs, with its trainer processes busy.
LONG_RUN = ["--data", "embedded", "--epochs", "30", "--devices", "2", "--no-timing"]
# The old exit waited for each trainer process to finish its job (up to 30 s); killed, they end at once. Measured
# here: ~1 s from the signal to the exit. The bound leaves room for a loaded CI machine and still fails the old way.
EXIT_WITHIN_S = 10


def interrupt_when(command, started: str, tmp_path):
    """Run `command`, send it SIGINT once a line containing `started` is printed, and return (its exit code, its
    stdout, its stderr, seconds from the signal to its exit, the child processes it had then)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=dict(env, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    for line in process.stdout:
        lines.append(line)
        if started in line:
            break
    deadline = time.monotonic() + 120
    while not children(process.pid) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # its trainer processes start after the line (check_model prints none of its own)
    time.sleep(2)  # and are at work
    assert process.poll() is None, "".join(lines) + process.stderr.read()
    had = children(process.pid)
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    try:
        rest, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    seconds = time.monotonic() - sent
    print(f"{seconds:.1f} s from the signal to the exit")
    return process.returncode, "".join(lines) + rest, stderr, seconds, had


def test_ctrl_c_mid_training_is_one_line_exit_130_within_seconds_and_no_process_left(tmp_path):
    report = tmp_path / "report.json"
    command = [sys.executable, os.path.join(ROOT, "compare.py"), *LONG_RUN, "--json", str(report)]
    code, stdout, stderr, seconds, had = interrupt_when(command, "epoch 1/", tmp_path)
    assert code == 130, stderr[-2000:]
    assert stderr.splitlines() == ["compare.py: interrupted: nothing written"], stderr[-2000:]
    assert seconds < EXIT_WITHIN_S, seconds
    assert had and not [pid for pid in had if alive(pid)]  # its trainer processes, stopped with it
    assert not report.exists() and os.listdir(tmp_path) == []


@pytest.mark.extended  # ~25 s: a plain run's Ctrl-C (above) is the default suite's
def test_ctrl_c_mid_sweep_stops_both_lanes_and_the_references_process(tmp_path):
    """Timed, so that the main run's trainers train on the sweep's two lanes beside the reference's process
    (shared/run/lanes.py): the interrupt comes while all three train."""
    timed = [arg for arg in LONG_RUN if arg != "--no-timing"]
    command = [sys.executable, os.path.join(ROOT, "compare.py"), *timed, "--sweep-devices", "2"]
    code, stdout, stderr, seconds, had = interrupt_when(command, "epoch 1/", tmp_path)
    assert code == 130, stderr[-2000:]
    assert stderr.splitlines() == ["compare.py: interrupted: nothing written"], stderr[-2000:]
    assert seconds < EXIT_WITHIN_S, seconds
    assert len(had) >= 2 and not [pid for pid in had if alive(pid)]
    assert os.listdir(tmp_path) == []


@pytest.mark.extended  # ~25 s: a plain run's Ctrl-C (above) is the default suite's
def test_ctrl_c_while_the_clients_train_stops_every_client(tmp_path):
    """--clients 2: the interrupt comes once both of dtensor's clients run (they start TensorFlow, then train)."""
    clients = ["--clients", "2", "--trainers", "dtensor", "--train-examples", "256", "--batch-size", "64"]
    command = [sys.executable, os.path.join(ROOT, "compare.py"), *LONG_RUN, *clients]
    code, stdout, stderr, seconds, had = interrupt_when(command, "dtensor: 2 clients on", tmp_path)
    pids = [int(pid) for pid in stdout.split("dtensor: 2 clients on", 1)[1].split("pids ", 1)[1].split()[0].split(",")]
    assert code == 130, stderr[-2000:]
    assert stderr.splitlines() == ["compare.py: interrupted: nothing written"], stderr[-2000:]
    assert seconds < EXIT_WITHIN_S, seconds
    assert set(pids) <= set(had) and not [pid for pid in had if alive(pid)]
    assert os.listdir(tmp_path) == []


CHECK_INTERRUPTED = """
import os, sys
from dtensor_vs_mirrored.shared.api import check_model
print("started", flush=True)
try:
    check_model("mlp", meshes=["batch=2"], devices=2, epochs=30, trainer_process="own", timing=False)
except KeyboardInterrupt:
    print("KeyboardInterrupt reached the caller", flush=True)
    sys.exit(7)
print("the check ended without the interrupt")
"""


def test_check_model_raises_keyboard_interrupt_to_its_caller_after_stopping_its_trainer_processes(tmp_path):
    command = [sys.executable, "-c", CHECK_INTERRUPTED]
    code, stdout, stderr, seconds, had = interrupt_when(command, "started", tmp_path)
    assert code == 7 and stdout.endswith("KeyboardInterrupt reached the caller\n"), (stdout, stderr[-2000:])
    assert seconds < EXIT_WITHIN_S, seconds
    assert had and not [pid for pid in had if alive(pid)]
