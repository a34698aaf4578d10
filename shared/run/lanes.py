"""A sweep's configurations trained side by side, in blocks: each lane a trainer process of its own, as many lanes
as cores (at most MAX_LANES); a block's configurations (BLOCK_LANES a lane) are trained, each lane taking the next
when it is free, and kept, then timed together beside the reference on a machine that trains nothing else
(shared/run/timing.py), and let go before the next block. Tracing, most of a configuration's training time, runs on
one core, so two lanes train two configurations in about the time of one. A lane's crash fails the configuration it
was training and leaves the others it kept in that block without a ratio (their verdicts stand); a failed reference
round leaves the whole block without ratios.

Only where nothing measured while training is reported: a timed float32 run (its speeds are the timing rounds'),
in trainer processes on the CPU, without --profile (whose step split is measured as the trainer finishes).
Elsewhere one lane, in plan order.
"""

import os
import threading
from typing import Callable, List, Optional, Sequence

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.measure.timing import wanted as timed_run
from dtensor_vs_mirrored.shared.run import children
from dtensor_vs_mirrored.shared.training.registry import chosen, distributed

MAX_LANES = 2
# Configurations a lane trains and keeps before a block is timed, all sharing the reference's rounds: more would
# share them further but set a round further from the reference's around it, and keep more trainers a lane. The
# first block also times the main run's trainers (one more a lane), which would otherwise take rounds of their own.
BLOCK_LANES = 2
# The lane of the reference's trainer process (reference_apart) where lanes train beside it (train_all before a sweep,
# and its float64 reruns): a process of its own; elsewhere the first lane's, whose trainers train after it in turn.
REFERENCE_LANE = MAX_LANES


def own_process(config: Config) -> bool:
    """Whether distributed trainers train in a trainer process of their own (--trainer-process)."""
    if config.trainer_process == "auto":
        return config.device_type == "CPU"  # GPUs: two processes would each reserve every GPU's memory
    return config.trainer_process == "own"


def reference_apart(config: Config) -> bool:
    """Whether the reference's runs train in a trainer process with one intra-op thread, as each device of the
    distributed trainers computes (its timing rounds stay in the run's process, with TensorFlow's default threads):
    wherever any of those train in processes of their own, on CPUs (with --profile too: its step split of the
    reference is measured there, with one thread). A process's intra-op thread count changes how its matmuls round:
    with the default threads the default run's float32 loss could leave its tolerance where with one thread it
    agreed (the run that showed it: docs/parity.md, "Kernels"). Decided by fields
    that a run's float64 reruns and repeats keep, so that all of the reference's runs train in one place."""
    return own_process(config) and config.device_type == "CPU" and bool(distributed(chosen(config)))


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


def queued(jobs: Sequence[Callable], lanes: Sequence[object], meanwhile: Optional[Callable] = None) -> List[Pending]:
    """A block: each lane (one of `lanes`: here, how a lane trains) takes the next job when it is free, in the jobs'
    order, and calls it with itself, while this thread calls `meanwhile` (the reference's run: here, or in its
    process); returns when every job has settled, their outcomes in the jobs' order. An interrupt, or what
    `meanwhile` raises, stops the trainer processes at once (not after their jobs), and the threads are daemons: the
    run does not wait for them."""
    outcomes = [Pending() for _ in jobs]
    pending, lock = iter(range(len(jobs))), threading.Lock()

    def drive(lane) -> None:
        while True:
            with lock:
                index = next(pending, None)
            if index is None:
                return
            try:
                outcomes[index].settle(jobs[index](lane))
            except BaseException as error:  # noqa: BLE001 - the caller's result() raises it, in its turn
                outcomes[index].settle(error=error)

    for lane in lanes[: len(jobs)]:
        threading.Thread(target=drive, args=(lane,), daemon=True).start()
    try:
        if meanwhile is not None:
            meanwhile()
        for outcome in outcomes:
            outcome.wait()  # every lane idle before anything is timed
    except BaseException:
        children.stop_all()  # the trainer processes: the threads reading them see their end
        raise
    return outcomes
