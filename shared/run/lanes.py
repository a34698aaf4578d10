"""A sweep's configurations trained side by side: each lane a trainer process of its own, as many lanes as cores
(at most MAX_LANES), each configuration trained and kept on the first free lane; then timed one at a time, each
beside the reference on a machine that trains nothing else (shared/run/timing.py). Tracing, most of a
configuration's training time, runs on one core, so two lanes train two configurations in about the time of one.

Only where nothing measured while training is reported: a timed float32 run (its speeds are the timing rounds'),
in trainer processes (on the CPU), without --profile (whose step split is measured as the trainer finishes).
Elsewhere one lane, in plan order, as before.
"""

import os
import queue
import threading
from typing import Callable, List, Sequence

from shared.config import Config
from shared.measure.timing import wanted as timed_run
from shared.run.sequence import own_process

MAX_LANES = 2


def lane_count(config: Config) -> int:
    """How many configurations train at once in this run's sweep."""
    if not (timed_run(config) and own_process(config)) or config.profile:
        return 1
    return max(1, min(MAX_LANES, os.cpu_count() or 1))


class Pending:
    """A job's outcome, when it has one: `result()` waits for it and returns it, or raises what the job raised."""

    def __init__(self):
        self._done = threading.Event()
        self._value, self._error = None, None

    def settle(self, value=None, error: BaseException = None) -> None:
        self._value, self._error = value, error
        self._done.set()

    def wait(self) -> None:
        self._done.wait()

    def result(self):
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


def side_by_side(jobs: Sequence[Callable], lanes: Sequence[object]) -> List[Pending]:
    """Each job called with a free lane (one of `lanes`: here, how a lane trains), in order as lanes free up; their
    outcomes, in the jobs' order. The threads are daemons: an interrupted run does not wait for them."""
    queued, outcomes = queue.Queue(), [Pending() for _ in jobs]
    for index, job in enumerate(jobs):
        queued.put((job, outcomes[index]))

    def drive(lane) -> None:
        while True:
            try:
                job, outcome = queued.get_nowait()
            except queue.Empty:
                return
            try:
                outcome.settle(job(lane))
            except BaseException as error:  # noqa: BLE001 - the caller's result() raises it, in its turn
                outcome.settle(error=error)

    for lane in lanes:
        threading.Thread(target=drive, args=(lane,), daemon=True).start()
    return outcomes
