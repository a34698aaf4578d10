"""Speed apart from parity: after a trainer's run, its steady train call (the one a measured epoch makes, on
batches it already has; of a round's steps where its trace runs any count: Trainer.step_call) timed again in
rounds, each between two of the reference's (shared/run/timing.py), so that a figure rests on TIMED_STEPS steps or
more whatever the data size, and a ratio has a spread: each round's examples/s over the mean of the reference's
just before and just after it, a drift between them cancelled.

A round is whole calls, each call's inputs prepared and run as an epoch does, until ROUND_STEPS steps and
ROUND_SECONDS have run (the first call after the other process ran is the slowest: a round of a few 15 ms calls
moved by half); a warm-up call before the first round is not timed. Costs ROUNDS rounds of each trainer and
ROUNDS + 1 of the reference's (REFERENCE_ROUND_STEPS steps), each at least ROUND_SECONDS.
"""

import dataclasses
import time
from typing import List, Optional, Tuple

import numpy as np

ROUNDS = 3  # a trainer's rounds: the spread of its ratio is the min-max of this many
ROUND_STEPS = 10  # at least, in whole calls: ROUNDS x ROUND_STEPS = TIMED_STEPS
ROUND_SECONDS = 0.4  # at least
# The reference's rounds, one more than a trainer's: 4 x 8 = 32 steps or more, as a trainer's 30, in whole calls (a
# call of the first round's steps: with 10, the GPT's reference ran two calls of its epoch's 8, ~0.8 s more a round).
REFERENCE_ROUND_STEPS = 8
TIMED_STEPS = ROUNDS * ROUND_STEPS  # shared.judge.ranking.MIN_RANKED_STEPS: a ratio from fewer is not ranked


@dataclasses.dataclass
class TimedRound:
    steps: int
    examples: int  # training examples in those steps
    seconds: float
    call_seconds: List[float]  # each call's, its input preparation included
    call_steps: List[int]

    @property
    def examples_per_second(self) -> float:
        return self.examples / self.seconds


@dataclasses.dataclass
class Timing:
    """A trainer's timed rounds, and for a distributed trainer the reference's around them: one before the first,
    then one after each (len(rounds) + 1)."""

    rounds: List[TimedRound]
    beside: List[TimedRound] = dataclasses.field(default_factory=list)

    @property
    def steps(self) -> int:
        """Timed steps: the fewer of this trainer's and, when paired, the reference's beside it."""
        own = sum(r.steps for r in self.rounds)
        return min(own, sum(r.steps for r in self.beside)) if self.beside else own

    def throughput(self) -> Tuple[float, float, float]:
        """Examples/s: (median, min, max) over the rounds."""
        return _median_min_max([r.examples_per_second for r in self.rounds])

    def reference_throughput(self) -> Optional[Tuple[float, float, float]]:
        return _median_min_max([r.examples_per_second for r in self.beside]) if self.beside else None

    def ratios(self) -> List[float]:
        """Each round's examples/s over the mean of the reference's rounds just before and after it."""
        rates = [b.examples_per_second for b in self.beside]
        around = [(before + after) / 2 for before, after in zip(rates, rates[1:])]
        return [r.examples_per_second / reference for r, reference in zip(self.rounds, around)]

    def ratio(self) -> Optional[Tuple[float, float, float]]:
        """The ratio to the reference: (median, min, max) over the pairs; None when not paired."""
        return _median_min_max(self.ratios()) if self.beside else None

    def step_times_ms(self) -> List[float]:
        return [1e3 * s / n for r in self.rounds for s, n in zip(r.call_seconds, r.call_steps)]


def wanted(config) -> bool:
    """Whether a run with this configuration (shared.config.Config) is timed apart from its epochs: not with
    --no-timing, nor in float64, whose steps also checksum the state (a timed call would trace anew)."""
    return config.timing and config.dtype == "float32"


def _median_min_max(values: List[float]) -> Tuple[float, float, float]:
    return float(np.median(values)), float(min(values)), float(max(values))


def time_round(call, steps: int = ROUND_STEPS, least_seconds: float = ROUND_SECONDS) -> TimedRound:
    """Whole calls of `call` (shared.measure.profile.StepCall), each prepared and run, until `steps` steps ran in
    `least_seconds` or more."""
    seconds, done = [], []
    while sum(done) < steps or sum(seconds) < least_seconds:
        started = time.perf_counter()
        call.run(call.prepare())  # returns when its last step has run
        seconds.append(time.perf_counter() - started)
        done.append(call.steps)
    return TimedRound(sum(done), len(done) * call.examples, sum(seconds), seconds, done)
