"""A sweep's configurations trained side by side, in waves: each lane a trainer process of its own, as many lanes
as cores (at most MAX_LANES); a wave trains one configuration on each lane and keeps them, then each is timed alone,
beside the reference, on a machine that trains nothing else (shared/run/timing.py), and let go before the next
wave. Tracing, most of a configuration's training time, runs on one core, so two lanes train two configurations in
about the time of one; a wave keeps at most one trainer a lane, and a lane's crash loses only its own.

Only where nothing measured while training is reported: a timed float32 run (its speeds are the timing rounds'),
in trainer processes on the CPU, without --profile (whose step split is measured as the trainer finishes).
Elsewhere one lane, in plan order, as before.
"""

import os
import threading
from typing import Callable, List, Sequence

from shared.config import Config
from shared.measure.timing import wanted as timed_run
from shared.run.sequence import own_process

MAX_LANES = 2


def lane_count(config: Config) -> int:
    """How many configurations train at once in this run's sweep."""
    if not (timed_run(config) and own_process(config)) or config.profile or config.device_type != "CPU":
        return 1
    return max(1, min(MAX_LANES, len(os.sched_getaffinity(0))))


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
    """A wave: each job called with its own lane (one of `lanes`: here, how a lane trains), all at once; their
    outcomes, in the jobs' order. The threads are daemons: an interrupted run does not wait for them."""
    if len(jobs) > len(lanes):
        raise ValueError(f"a wave of {len(jobs)} jobs on {len(lanes)} lanes")
    outcomes = [Pending() for _ in jobs]

    def drive(job, lane, outcome: Pending) -> None:
        try:
            outcome.settle(job(lane))
        except BaseException as error:  # noqa: BLE001 - the caller's result() raises it, in its turn
            outcome.settle(error=error)

    for job, lane, outcome in zip(jobs, lanes, outcomes):
        threading.Thread(target=drive, args=(job, lane, outcome), daemon=True).start()
    return outcomes
