"""A trainer process (shared/run/worker.py) as a run uses it: it gets the run's data once, trains job after job with
it, and one that dies between jobs is replaced, its next trainer unharmed."""

import os
import signal

import pytest

from shared.config import Config
from shared.run import worker
from tests.cli import data_slice


@pytest.mark.extended  # a process of its own (~10 s); the default suite trains through trainer processes elsewhere
def test_the_data_goes_once_and_a_process_that_died_between_jobs_is_replaced(embedded, monkeypatch):
    sent = []
    real_send = worker.send
    monkeypatch.setattr(worker, "send", lambda stream, message: sent.append(message[0]) or real_send(stream, message))
    config = Config(trainers=("dtensor", "mirrored"), devices=2, epochs=1, batch_size=64, quiet=True)
    data = data_slice(embedded, 128, 64)
    process = worker.TrainerProcess({"TF_NUM_INTRAOP_THREADS": "1"}, 2)
    try:
        first = process.train("dtensor", config, data, print)
        second = process.train("mirrored", config, data, print)
        assert not first.failed and not second.failed, (first.error, second.error)
        assert sent == ["data", "train", "train"]  # the second job reused the data the process holds
        os.kill(process.process.pid, signal.SIGKILL)
        process.process.wait()
        third = process.train("mirrored", config, data, print)  # a new process, which gets the data again
        assert not third.failed and third.history.step_losses == second.history.step_losses
        assert sent == ["data", "train", "train", "data", "train"]
    finally:
        process.close()
