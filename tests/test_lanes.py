"""A sweep's configurations trained side by side (shared/run/lanes.py): a block runs its jobs on the lanes, each lane
taking the next when it is free, the outcomes in the jobs' order, a job's error raised in its turn; and a timed sweep
that trains two at a time judges and times every configuration, its main run's trainers side by side too."""

import threading
import time

import pytest

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.run import worker
from dtensor_vs_mirrored.shared.run.lanes import lane_count, queued, reference_apart
from tests.cli import SMALL, data_slice, read_report, run_here

WAIT_S = 30  # a job waits this long at most for the other lane's: a hang fails, it does not stall the suite


def test_a_block_runs_its_jobs_on_the_lanes_at_once_each_lane_taking_the_next_and_gives_them_in_order():
    both_started = threading.Barrier(2, timeout=WAIT_S)  # the first two return only if they ran at the same time
    ran = []

    def job(index):
        def run(lane):
            if index < 2:
                both_started.wait()
            ran.append((index, lane))
            return (index, lane)

        return run

    outcomes = queued([job(0), job(1), job(2), job(3)], ["a", "b"])
    found = [outcome.result() for outcome in outcomes]
    assert [index for index, _ in found] == [0, 1, 2, 3] and {lane for _, lane in found} == {"a", "b"}
    assert {lane for index, lane in found[:2]} == {"a", "b"}  # one job a lane at first
    assert sorted(ran) == found


def test_a_jobs_error_is_raised_in_its_turn_and_the_other_job_finishes():
    def job(index):
        def run(lane):
            if index == 0:
                raise ValueError("job 0 failed")
            return index

        return run

    outcomes = queued([job(0), job(1)], ["a", "b"])
    assert outcomes[1].result() == 1
    with pytest.raises(ValueError, match="job 0 failed"):
        outcomes[0].result()


def test_meanwhile_runs_here_while_the_lanes_run_their_jobs_and_what_it_raises_is_raised(monkeypatch):
    both_started = threading.Barrier(2, timeout=WAIT_S)  # returns only if the job and `meanwhile` run at once
    here = []

    def job(lane):
        both_started.wait()
        return lane

    outcomes = queued([job], ["a", "b"], meanwhile=lambda: here.append(both_started.wait() is not None))
    assert outcomes[0].result() == "a" and here == [True]

    def failing():
        raise ValueError("the reference failed to start")

    # queued stops the trainer processes then, at once: a real one, started and busy loading TensorFlow (alone in
    # the registry: other tests' kept processes are not this test's to stop).
    monkeypatch.setattr(worker, "_processes", {})
    process = worker.trainer_process({"LANES_TEST": "1"}, Config(), 1).started().process
    with pytest.raises(ValueError, match="the reference failed to start"):
        queued([lambda lane: lane], ["a"], meanwhile=failing)
    assert process.wait(timeout=WAIT_S) < 0  # killed by a signal, not told to finish its job


def test_lanes_only_where_nothing_measured_while_training_is_reported():
    lanes = lane_count(Config())
    assert 1 <= lanes <= 2
    assert lane_count(Config(dtype="float64")) == 1  # untimed: a ratio from its epochs
    assert lane_count(Config(timing=False)) == 1
    assert lane_count(Config(profile=True)) == 1  # the step split is measured as the trainer finishes
    assert lane_count(Config(trainer_process="shared")) == 1  # one process: nothing to run beside it
    assert lane_count(Config(device_type="GPU", trainer_process="own")) == 1  # each would reserve every GPU


def test_the_reference_runs_apart_wherever_a_distributed_trainer_has_a_process_of_its_own_on_cpus():
    assert reference_apart(Config())
    assert not reference_apart(Config(trainer_process="shared"))  # everything here: the same threads for all
    assert not reference_apart(Config(device_type="GPU", trainer_process="own"))  # a GPU's kernels use no intra-op pool
    # Decided by what its float64 reruns and repeats keep: --profile (which they drop) does not move it.
    from dtensor_vs_mirrored.shared.run.sequence import float64_config, repeat_config

    for config in (Config(profile=True), Config(profile=True, sweep_devices=(2,))):
        assert all(reference_apart(run) for run in (config, float64_config(config), repeat_config(config)))
    assert not reference_apart(Config(trainers=("reference",)))  # no device to compute as


def test_the_reference_runs_in_a_process_with_one_intra_op_thread_and_is_timed_here(devices, embedded):
    """Its run in the trainer process (TF_NUM_INTRAOP_THREADS=1), the trainer kept for its timing rounds made here,
    where TensorFlow's default threads are: rounds timed without a message to that process."""
    from dtensor_vs_mirrored.shared.run.sequence import TrainedBy, lineup
    from dtensor_vs_mirrored.shared.training.protocol import RunControl
    from dtensor_vs_mirrored.shared.training.registry import Kept

    config = Config(trainers=("reference", "dtensor"), epochs=1, devices=2, batch_size=64, quiet=True)
    train = TrainedBy(data_slice(embedded, 256, 64), devices)
    process = train.process("reference", config)
    assert process.environment["TF_NUM_INTRAOP_THREADS"] == "1"
    result = train(lineup(config)[0], config, RunControl(keep=True))
    assert not result.failed and len(result.history.step_losses) == 4, result.error
    assert process.process is not None and process.process.poll() is None  # it trained there, and runs on
    assert type(result.kept) is Kept  # not a trainer process's proxy (KeptThere)
    sent = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(worker, "send", lambda *args: sent.append(args))
        timed = result.kept.time(8)
    assert timed.steps >= 8 and timed.seconds > 0 and sent == []
    result.release()


def test_what_is_made_in_a_thread_is_waited_for_and_what_it_raises_is_raised_where_it_is_waited_for():
    from dtensor_vs_mirrored.shared.run.sequence import in_a_thread, untimed_on_error

    started = threading.Event()
    made = in_a_thread(lambda: started.wait(WAIT_S) and "made")
    started.set()  # it runs beside this thread: it waits for this
    assert made() == "made"

    def failing():
        raise ValueError("could not make the timing reference")

    with pytest.raises(ValueError, match="could not make the timing reference"):
        in_a_thread(failing)()

    def no_steady_call():  # a --fit reference's Trainer.step_call
        raise NotImplementedError("Keras's model.fit has no steady call to time")

    assert untimed_on_error(in_a_thread(no_steady_call)) is None  # no figure: its speeds from its epochs, no failure


@pytest.mark.skipif(lane_count(Config()) < 2, reason="one core: a sweep trains on one lane")
def test_where_lanes_train_beside_the_reference_its_runs_float64_too_have_a_process_no_lane_has(devices, embedded):
    """The main run before a sweep trains the reference while the lanes train the others, and its float64 rerun while
    they rerun theirs (explain): one process driven from two threads at once would cross their messages."""
    from dtensor_vs_mirrored.shared.run.sequence import float64_config, main_run_lanes

    config = Config(trainers=("reference", "dtensor", "mirrored"), devices=2, sweep_devices=(2,))
    lanes = main_run_lanes(config, embedded, devices)
    assert len(lanes) == 2
    for run in (config, float64_config(config)):
        reference = lanes[0].process("reference", run)
        assert reference is not None and reference.environment["TF_NUM_INTRAOP_THREADS"] == "1"
        assert all(reference is not lane.process(name, run) for lane in lanes for name in ("dtensor", "mirrored"))
    plain = main_run_lanes(config.replace(sweep_devices=None), embedded, devices)  # in turn: the trainers' process
    assert len(plain) == 1 and plain[0].process("reference", config) is plain[0].process("dtensor", config)


@pytest.mark.skipif(lane_count(Config()) < 2, reason="one core: a sweep trains on one lane")
def test_the_header_says_a_main_run_before_a_sweep_trains_beside_the_reference():
    from dtensor_vs_mirrored.shared.run.sequence import describe_processes

    one = describe_processes(Config(trainers=("reference", "dtensor"), sweep_devices=(2,)))
    assert "dtensor trains in its process while the reference trains in its own: the epoch and trace times ran" in one
    assert "while the reference" not in describe_processes(Config(trainers=("reference", "dtensor")))  # no sweep
    for untimed in (Config(dtype="float64"), Config(timing=False)):  # no timing rounds: the header names none
        assert describe_processes(untimed).endswith("mirrored in a trainer process (TF_NUM_INTRAOP_THREADS=1)")
    assert describe_processes(Config()).endswith("the reference's timing rounds here (TensorFlow's default threads)")


# The longest default test (40 s): a sweep's real run stays default on one lane (tests/test_profile.py), the
# lanes' scheduling in the tests above.
@pytest.mark.extended
@pytest.mark.skipif(lane_count(Config()) < 2, reason="one core: a sweep trains on one lane")
def test_a_timed_sweep_trains_on_two_lanes_and_times_and_judges_every_configuration(tmp_path, monkeypatch):
    """Adam at learning rate 1e4 (tests/test_verdicts.py): float32 leaves its tolerance on some configurations, and
    their float64 reruns train on the lanes with their block (Blocks.rerun), which the judge then takes."""
    from dtensor_vs_mirrored.shared.run import sweep as sweep_module

    rerun, pretrained = sweep_module.Blocks.rerun, []

    def recorded(self, block):
        rerun(self, block)
        pretrained.append((sorted(key for key, _ in self.reruns), "float64" in self.done, self))

    monkeypatch.setattr(sweep_module.Blocks, "rerun", recorded)
    from dtensor_vs_mirrored.shared.run import sequence

    side_by_side, on_lanes = sequence.side_by_side, []

    def recorded_side_by_side(entries, lanes, control, run=None, meanwhile=lambda beside_lanes: None):
        spans = []  # this call's: (what, started, ended)

        def timed(key, call):
            started = time.perf_counter()
            call()
            spans.append((key, started, time.perf_counter()))

        def on_lane(train, entry):
            found = []
            timed(entry.key, lambda: found.append((run or (lambda t, e: t(e, e.config, control)))(train, entry)))
            return found[0]

        here = lambda beside: timed("here", lambda: meanwhile(beside))  # noqa: E731
        trained = side_by_side(entries, lanes, control, on_lane, here)
        on_lanes.append((run, sorted(trained), spans))
        return trained

    monkeypatch.setattr(sequence, "side_by_side", recorded_side_by_side)
    report_path = tmp_path / "report.json"
    small = [arg for arg in SMALL if arg not in ("--no-timing",)]
    small[small.index("--trainer-process") + 1] = "own"
    result = run_here(*small, "--learning-rate", "1e4", "--sweep-devices", "2", "--json", str(report_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    count = 3
    joined = result.stdout.replace("\n" + " " * 11, " ").replace("\n  ", " ")  # lines broken to fit, joined
    assert (
        f"sweep: {count} configurations trained 2 at a time, then timed in blocks of up to 4, the first with the main "
        "run's trainers, their rounds in turn between the reference's" in joined.splitlines()
    )
    assert (
        "dtensor and mirrored train side by side, one a core, as the sweep's configurations do, while the reference"
        " trains in its own" in joined
    )
    sweep = read_report(report_path)["sweep"]
    assert [(e["mesh"], e["shard_weights"], e["update"]) for e in sweep] == [
        ("batch=2", False, ""),  # the main run's
        ("batch=2", True, ""),
        ("batch=1,model=2", False, ""),
        ("", False, "primary"),  # the main run's
        ("", False, "replicas"),
    ]
    # One block, the main run's two timed in its rounds: every ratio beside the same rounds of the reference.
    beside = {entry["reference_examples_per_s"] for entry in sweep}
    assert len(beside) == 1 and None not in beside, beside
    assert read_report(report_path)["compute"]["matmul_peak_gflops"] > 0  # measured after that timing
    for entry in sweep:
        assert entry["verdict"] in ("ok", "float noise") and entry["parity_ok"] is True, entry["reason"]
        assert entry["measured_steps"] >= 30 and entry["ratio_spread"][0] <= entry["ratio_to_reference"]
    reran = [(e["trainer"], e["float64_rerun_seconds"]) for e in sweep[1:3] + sweep[4:] if e["verdict"] != "ok"]
    assert reran and all(seconds > 0 for _, seconds in reran)  # the lanes' seconds
    ((keys, reference_done, blocks),) = pretrained  # one block of 3
    report = read_report(report_path)
    main_reran = sorted(name for name in ("dtensor", "mirrored") if report["parity"][name]["verdict"] == "float noise")
    explained = [keys for run, keys, _ in on_lanes if run is sequence.train_float64 and keys]
    assert explained == ([main_reran] if main_reran else [])  # the main run's reruns, side by side
    # The main run's reference trained (in its process) while the lanes trained dtensor and mirrored: spans overlap.
    main_keys, main_spans = next((keys, found) for run, keys, found in on_lanes if run is None)
    assert main_keys == ["dtensor", "mirrored"]
    here = next((start, end) for key, start, end in main_spans if key == "here")
    lanes = [(start, end) for key, start, end in main_spans if key != "here"]
    assert len(lanes) == 2 and min(start for start, _ in lanes) < here[1] and here[0] < max(end for _, end in lanes)
    assert keys == sorted(trainer for trainer, _ in reran) and reference_done and blocks.reruns == {}  # all taken


def test_on_a_terminal_the_reference_beside_the_lanes_draws_no_progress_bar(monkeypatch):
    """The first lane's trainer process draws one (shared/run/worker.py); a second, the reference's here, would write
    over it (RunControl.progress_bar)."""
    import io

    from dtensor_vs_mirrored.shared.report.progress import Printed

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stderr", Terminal())
    monkeypatch.delenv("COMPARE_NO_PROGRESS_BAR", raising=False)
    drawn, beside = Printed(), Printed(bar=False)
    for progress in (drawn, beside):
        progress.epoch_started("epoch 1", 8)
    assert not drawn.bar.disable and beside.bar.disable
