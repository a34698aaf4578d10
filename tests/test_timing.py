"""Timing apart from parity (shared/measure/timing.py, shared/run/timing.py): the arithmetic of rounds and ratios on
set seconds (the timings themselves are the benchmark's, not a test's), a trainer kept after its run and timed
again, and a trainer process's side of it. ~5 s on 2 cores.
"""

import io
import time

import pytest

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.measure import timing
from dtensor_vs_mirrored.shared.measure.timing import TimedRound, Timing
from dtensor_vs_mirrored.shared.run import worker
from dtensor_vs_mirrored.shared.run.results import TrainerResult
from dtensor_vs_mirrored.shared.run.timing import beside
from dtensor_vs_mirrored.shared.training.registry import fit_and_keep
from tests.cli import data_slice


def timed(examples_per_second: float, steps: int = 10, batch: int = 100) -> TimedRound:
    seconds = steps * batch / examples_per_second
    return TimedRound(steps, steps * batch, seconds, [seconds / 2] * 2, [steps // 2] * 2)


def test_a_ratio_is_each_round_against_the_mean_of_the_reference_rounds_around_it():
    """A reference that drifts from 1,000 to 1,400 examples/s while the trainer runs at 600 gives 0.5 each time,
    not the 0.6 to 0.43 that one side of each pair would."""
    found = Timing([timed(600), timed(600), timed(600)], [timed(1000), timed(1400), timed(1000), timed(1400)])
    assert [round(ratio, 6) for ratio in found.ratios()] == [0.5, 0.5, 0.5]
    assert found.ratio() == pytest.approx((0.5, 0.5, 0.5))
    assert found.throughput() == pytest.approx((600, 600, 600))
    assert found.reference_throughput() == pytest.approx((1200, 1000, 1400))
    assert found.steps == 30  # the fewer: its own 30 against the reference's 40
    spread = Timing([timed(500), timed(600), timed(700)], [timed(1000)] * 4)
    assert spread.ratio() == pytest.approx((0.6, 0.5, 0.7))
    assert spread.step_times_ms() == pytest.approx([1e5 / rate for rate in (500, 500, 600, 600, 700, 700)])


class FakeCall:
    """A StepCall of `steps` steps and `examples` examples whose run takes no time; counts its calls."""

    def __init__(self, steps: int, examples: int):
        self.steps, self.examples, self.calls = steps, examples, 0

    def prepare(self):
        return None

    def run(self, inputs):
        self.calls += 1


def test_a_round_is_whole_calls_until_its_steps_and_seconds_have_run():
    call = FakeCall(4, 512)
    found = timing.time_round(call, steps=10, least_seconds=0.0)
    assert (found.steps, found.examples, call.calls, found.call_steps) == (12, 1536, 3, [4, 4, 4])
    assert timing.TIMED_STEPS == timing.ROUNDS * timing.ROUND_STEPS == 30  # shared.judge.ranking.MIN_RANKED_STEPS
    assert (timing.ROUNDS + 1) * timing.REFERENCE_ROUND_STEPS >= timing.TIMED_STEPS  # the reference's, around them


class Kept:
    def __init__(self, examples_per_second, fail_at=None, order=None, name=""):
        self.rate, self.rounds, self.fail_at, self.released = examples_per_second, 0, fail_at, False
        self.order, self.name = order if order is not None else [], name

    def time(self, steps):
        self.rounds += 1
        self.order.append(self.name)
        return None if self.rounds == self.fail_at else timed(self.rate, steps)

    def release(self):
        self.released = True


def test_each_round_runs_between_two_of_the_references_and_a_failed_round_gives_no_figure():
    reference, trainer = TrainerResult("reference", kept=Kept(1000)), TrainerResult("dtensor", kept=Kept(500))
    [found] = beside(reference, [trainer])
    assert (reference.kept.rounds, trainer.kept.rounds) == (4, 3) and found.ratio() == pytest.approx((0.5,) * 3)
    assert beside(reference, [TrainerResult("mirrored", kept=Kept(500, fail_at=2))]) == [None]
    assert beside(reference, [TrainerResult("mirrored")]) == [None]  # not kept: timed by its epochs

    class Raising(Kept):
        def time(self, steps):
            raise RuntimeError("the call failed")

    assert beside(reference, [TrainerResult("mirrored", kept=Raising(500))]) == [None]  # no figure; the run goes on


def test_a_block_is_timed_interleaved_sharing_the_reference_rounds_and_one_failure_stops_only_its_own():
    """R A B R A B R A B R: 4 reference rounds for two trainers where one each took 8; each ratio against the
    reference rounds just before and after its round; B failing its second round leaves A timed, B without."""
    order = []
    reference = TrainerResult("reference", kept=Kept(1000, order=order, name="R"))
    a, b = (TrainerResult(n, kept=Kept(rate, order=order, name=n)) for n, rate in (("A", 500), ("B", 250)))
    found = beside(reference, [a, b])
    assert "".join(order) == "RABRABRABR"
    assert [f.ratio() for f in found] == [pytest.approx((0.5,) * 3), pytest.approx((0.25,) * 3)]
    assert all(len(f.beside) == 4 and f.steps == 30 for f in found)
    order.clear()
    reference.kept.rounds, failing = 0, TrainerResult("B", kept=Kept(250, fail_at=2, order=order, name="B"))
    a = TrainerResult("A", kept=Kept(500, order=order, name="A"))
    found = beside(reference, [a, failing])
    assert "".join(order) == "RABRABRAR" and found[1] is None and found[0].ratio() == pytest.approx((0.5,) * 3)


def test_a_kept_trainer_is_not_pickled_and_a_trainer_process_times_and_releases_it():
    result = TrainerResult("dtensor", kept=Kept(500))
    assert result.__getstate__()["kept"] is None  # it stays in the process that trained it
    kept, replies = {1: Kept(500, fail_at=2)}, io.BytesIO()
    worker.keep(("time", 1, 10), kept, replies)
    worker.keep(("time", 1, 10), kept, replies)  # its second round fails: no figure, no crash
    held = kept[1]
    worker.keep(("release", 1), kept, replies)
    replies.seek(0)
    first, second = worker.receive(replies), worker.receive(replies)
    assert first[0] == "timed" and first[1].steps == 10 and second == ("timed", None)
    assert held.released and kept == {1: None}


def test_a_trained_trainer_kept_for_timing_runs_its_steady_call_again(devices, embedded):
    from dtensor_vs_mirrored.shared.training.protocol import RunControl

    config = Config(trainers=("reference",), devices=1, epochs=1, batch_size=64, hidden=(32,), quiet=True)
    history, kept = fit_and_keep(
        "reference", config, data_slice(embedded, 256, 64), devices[:1], None, RunControl(keep=True)
    )
    found = kept.time(10)
    assert found.steps >= 10 and found.steps % 4 == 0 and found.examples == found.steps * 64  # whole calls of 4
    assert found.seconds >= timing.ROUND_SECONDS and len(history.step_losses) == 4
    kept.release()


def test_a_trace_that_runs_any_step_count_is_timed_a_rounds_steps_a_call_and_a_run_can_skip_evaluating(
    devices, embedded
):
    """The reference's and MirroredStrategy's timed call is a round's steps, not the epoch's 15 (the ViT's 31 took
    2 s a reference round); a run told not to evaluate (a sweep's configuration) has no test metrics."""
    from dtensor_vs_mirrored.shared.report.progress import format_epoch_line
    from dtensor_vs_mirrored.shared.training.protocol import RunControl

    config = Config(devices=2, epochs=1, batch_size=64, hidden=(32,), quiet=True)
    data = data_slice(embedded, 1000, 64)  # 15 full batches and one of 40
    for name, devices_used, steps in (("reference", devices[:1], 8), ("mirrored", devices[:2], 10)):
        history, kept = fit_and_keep(name, config, data, devices_used, None, RunControl(keep=True, evaluate=False))
        traced = kept.trainer.trace_count()
        found = kept.time(steps)
        assert kept.trainer.trace_count() == traced, name  # the epoch's trace, run with fewer steps
        assert set(found.call_steps) == {steps} and found.examples == found.steps * 64, name
        assert [(record.test_loss, record.test_accuracy) for record in history.epochs] == [(None, None)]
        assert history.epochs[0].train_loss > 0 and len(history.step_losses) == 16
        assert "  test_loss -  test_acc -  " in format_epoch_line(name, history.epochs[0], 1)
        kept.release()


def test_a_round_longer_than_an_epoch_is_made_of_equal_calls_of_no_more_steps_than_it_needs(devices, embedded):
    """MirroredStrategy's epoch of 8 steps (the GPT's) times a round of 10 as calls of 5, not of 8: 16 steps a
    round cost the GPT's sweep ~3 s of its two MirroredStrategy configurations."""
    from dtensor_vs_mirrored.shared.training.protocol import RunControl

    config = Config(devices=2, epochs=1, batch_size=64, hidden=(32,), quiet=True)
    data = data_slice(embedded, 512, 64)  # 8 full batches
    _, kept = fit_and_keep("mirrored", config, data, devices[:2], None, RunControl(keep=True, evaluate=False))
    traced = kept.trainer.trace_count()
    found = kept.time(10)
    assert kept.trainer.trace_count() == traced  # the epoch's trace, run with fewer steps
    assert set(found.call_steps) == {5} and found.steps >= 10 and found.examples == found.steps * 64
    kept.release()


def test_the_speeds_say_what_they_stand_for_on_cpus_and_gpus():
    from dtensor_vs_mirrored.shared.measure.machine import Machine

    assert Machine("CPU", 8, 1, 2, "AMD EPYC").describe() == (
        "speeds: 8 logical CPUs sharing 2 cores (AMD EPYC): a device adds no compute, so examples/s and ratios rank "
        "configurations on this machine only; bytes per step and memory per device carry over to GPUs, CPU speeds "
        "do not"
    )
    one_each = Machine("GPU", 8, 8, 16, "NVIDIA H200")
    assert one_each.describe() == "speeds: 8 GPUs (NVIDIA H200), one per device: measured on them"
    assert one_each.speeds_transfer and not Machine("GPU", 4, 1, 16, "").speeds_transfer
    assert Machine("GPU", 4, 1, 16, "").describe() == (
        "speeds: 4 logical GPUs split from 1: they share its compute, so speeds rank configurations on this GPU "
        "only; bytes per step and memory per device carry over"
    )


def test_a_main_run_left_untimed_is_timed_once_with_the_first_block_and_the_reference_keeps_those_rounds():
    """shared/run/sweep.py Blocks.take_block: the main run's kept trainers (train_all's time_later) and a block's in
    one set of rounds (R M A R M A R M A R), the reference's own figure from them; a second call times nothing."""
    from dtensor_vs_mirrored.shared.measure.history import History
    from dtensor_vs_mirrored.shared.run.timing import time_run, untimed

    order = []

    def result(name, rate):
        return TrainerResult(name, History(name, "here"), kept=Kept(rate, order=order, name=name))

    main = {"reference": result("R", 1000), "dtensor": result("M", 500)}
    block = [result("A", 250)]
    assert untimed(main) == [main["dtensor"]]
    time_run(main, also=block)
    assert "".join(order) == "RMARMARMAR"
    assert main["dtensor"].history.timing.ratio() == pytest.approx((0.5,) * 3)
    assert block[0].history.timing.ratio() == pytest.approx((0.25,) * 3)
    assert len(main["reference"].history.timing.rounds) == 4 and main["dtensor"].kept is None  # timed, let go
    assert untimed(main) == [] and main["reference"].kept is not None  # the reference stays kept for later blocks
    time_run(main)
    assert "".join(order) == "RMARMARMAR"  # nothing left: no round more, not even the reference's alone


def test_a_call_warmed_long_before_its_first_round_runs_once_more_untimed_and_a_fresh_one_once():
    """Kept.time: the reference kept untrained (kept_untrained) is warmed while its run trains, minutes before its
    first round, so that round follows an untimed call as every trainer's first round does; a trained trainer's call,
    made by its first round, is run once before it, not twice."""
    import contextlib

    from dtensor_vs_mirrored.shared.measure.profile import StepCall
    from dtensor_vs_mirrored.shared.training.registry import Kept

    class Trainer:
        def __init__(self):
            self.runs = []

        def step_call(self, most_steps=0):
            return StepCall(8, lambda: None, lambda inputs: self.runs.append(time.sleep(0.1)), examples=64)

    for warmed_before, untimed in ((True, 2), (False, 1)):
        trainer = Trainer()
        kept = Kept(trainer, contextlib.nullcontext)
        if warmed_before:
            kept.warm(8)
        first = kept.time(8)
        assert len(trainer.runs) == untimed + len(first.call_steps)  # the untimed calls, then the round's
        second = kept.time(8)  # no untimed call before a later round
        assert len(trainer.runs) == untimed + len(first.call_steps) + len(second.call_steps)


def test_an_epoch_whose_trainer_marks_its_steps_starts_is_timed_by_its_steps_alone():
    """model.fit's epoch (shared/training/keras_fit.py) marks each batch's start: its set-up before the first batch
    and its wind-down after the last are no step's time and not the epoch's (a 4-step call under MirroredStrategy
    took 0.45 s for 20 ms of steps); a trainer that marks nothing is timed end to end."""
    from dtensor_vs_mirrored.shared.measure.history import EpochMeter

    def epoch(marked: bool):
        meter = EpochMeter()
        time.sleep(0.1)  # a set-up
        if marked:
            meter.step_begins()
        time.sleep(0.01)  # the step
        meter.add(1.0, 1.0, 1)
        time.sleep(0.1)  # a wind-down
        return meter.finish()[3], meter.call_seconds[0]

    (seconds, step), (whole, first_call) = epoch(True), epoch(False)
    assert 0.01 <= step == seconds < 0.09, (step, seconds)
    assert whole >= 0.21 and first_call >= 0.11, (whole, first_call)


def test_a_cpus_name_loses_its_trademark_marks_so_the_header_reads_plainly():
    from dtensor_vs_mirrored.shared.measure.machine import Machine, plain_name

    assert plain_name(" Intel(R) Xeon(R) Processor\n") == "Intel Xeon Processor"
    assert plain_name("Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz") == "Intel Core i7-8700 CPU @ 3.20GHz"
    assert plain_name("AMD EPYC 7B13") == "AMD EPYC 7B13"
    named = Machine("CPU", 8, 1, 2, plain_name("Intel(R) Xeon(R) Processor")).describe()
    assert named.startswith("speeds: 8 logical CPUs sharing 2 cores (Intel Xeon Processor): a device adds")
