"""A trainer process (shared/run/worker.py) as a run uses it: it gets the run's data once, trains job after job with
it, reports each trainer's own peak memory, and one that dies between jobs is replaced, its next trainer unharmed."""

import os
import signal

import pytest

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.run import worker
from tests.cli import data_slice


@pytest.mark.extended  # a process of its own (~10 s); the default suite trains through trainer processes elsewhere
def test_the_data_goes_once_and_a_process_that_died_between_jobs_is_replaced(embedded, monkeypatch):
    sent = []
    real_send = worker.send
    monkeypatch.setattr(worker, "send", lambda stream, message: sent.append(message[0]) or real_send(stream, message))
    config = Config(trainers=("dtensor", "mirrored"), devices=2, epochs=1, batch_size=64, quiet=True)
    data = data_slice(embedded, 128, 64)
    process = worker.TrainerProcess({"TF_NUM_INTRAOP_THREADS": "1"}, 2)
    ballast = b"\x01" * (3 * 2**30)  # 3 GB held here while the process starts: its peak must not count them
    try:
        first = process.train("dtensor", config, data, print)
        del ballast
        second = process.train("mirrored", config, data, print)
        assert not first.failed and not second.failed, (first.error, second.error)
        for result in (first, second):  # the process's own peak and its rise while the trainer trained
            assert 0 < result.peak_memory_rise_mb < result.peak_memory_mb < 2500, result.peak_memory_mb
        assert sent == ["data", "train", "train"]  # the second job reused the data the process holds
        os.kill(process.process.pid, signal.SIGKILL)
        process.process.wait()
        third = process.train("mirrored", config, data, print)  # a new process, which gets the data again
        assert not third.failed and third.history.step_losses == second.history.step_losses
        assert sent == ["data", "train", "train", "data", "train"]
    finally:
        process.close()


@pytest.mark.extended  # a process of its own (~10 s)
def test_a_process_whose_messages_break_off_is_that_trainers_failed_line_not_the_runs_end(embedded):
    """The process's reply stream holds garbage where a message should be: the trainer is FAILED in one line, the
    process is stopped, and the next job gets a new process."""
    config = Config(trainers=("mirrored",), devices=2, epochs=1, batch_size=64, quiet=True)
    data = data_slice(embedded, 128, 64)
    process = worker.TrainerProcess({"TF_NUM_INTRAOP_THREADS": "1"}, 2)
    try:
        process.start()
        garbage, writer = os.pipe()
        os.write(writer, worker.HEADER.pack(9) + b"not a pickle"[:9])
        os.close(writer)
        started = process.process
        started.stdout = os.fdopen(garbage, "rb")  # what the parent reads: a message that does not unpickle
        broken = process.train("mirrored", config, data, print)
        assert broken.failed and broken.error.startswith("its messages broke off (UnpicklingError: "), broken.error
        assert broken.error.endswith("while starting TensorFlow; its process was stopped")
        assert started.returncode is not None and process.process is None
        again = process.train("mirrored", config, data, print)
        assert not again.failed, again.error
    finally:
        process.close()


def test_at_exit_every_trainer_process_is_told_to_finish_before_any_is_waited_for(monkeypatch):
    """close_all: each process ends beside the others (a sweep's two lanes: 1.24 s against 2.19 s in turn), and none
    is left running."""
    started = [worker.TrainerProcess({"TF_NUM_INTRAOP_THREADS": "1"}, 2).started() for _ in range(2)]
    monkeypatch.setattr(worker, "_processes", dict(enumerate(started)))
    popens, told_all = [trainer_process.process for trainer_process in started], []
    for popen in popens:
        wait = popen.wait

        def recorded(timeout=None, wait=wait):
            told_all.append(all(other.stdin.closed for other in popens))
            return wait(timeout=timeout)

        popen.wait = recorded
    worker.close_all()
    assert told_all and all(told_all)  # a process that finished meanwhile is not waited for
    assert all(popen.returncode is not None for popen in popens) and worker._processes == {}


def test_a_process_told_to_finish_ends_well_and_leaves_no_file_autograph_generated(embedded, tmp_path):
    """worker.main ends the process without winding TensorFlow down (1-2.5 s at every run's end), but after its exit
    handlers: autograph's remove the files it generated for each function it converted (their own temporary
    directory here, TMPDIR), which were left behind in /tmp while the handlers were skipped."""
    config = Config(trainers=("mirrored",), devices=2, epochs=1, batch_size=64, quiet=True)
    process = worker.TrainerProcess({"TF_NUM_INTRAOP_THREADS": "1", "TMPDIR": str(tmp_path)}, 2)
    try:
        result = process.train("mirrored", config, data_slice(embedded, 128, 64), print)
        assert not result.failed, result.error
        assert any(name.startswith("__autograph_generated_file") for name in os.listdir(tmp_path))
        started = process.process
    finally:
        process.close()
    assert started.returncode == 0 and os.listdir(tmp_path) == []
