"""A sweep's configurations trained side by side (shared/run/lanes.py): each job on one free lane at a time, the
outcomes in the jobs' order, a job's error raised in its turn; and a timed sweep that trains on two lanes judges
and times every configuration as one lane would."""

import threading

import pytest

from shared.config import Config
from shared.run.lanes import lane_count, side_by_side
from tests.cli import SMALL, read_report, run_here

WAIT_S = 30  # a job waits this long at most for the other lane's: a hang fails, it does not stall the suite


def test_jobs_run_on_free_lanes_at_once_and_their_outcomes_come_in_order():
    both_started = threading.Barrier(2, timeout=WAIT_S)  # the first two jobs return only if they ran at once
    busy, clashes = set(), []

    def job(index):
        def run(lane):
            if lane in busy:
                clashes.append(lane)
            busy.add(lane)
            if index < 2:
                both_started.wait()
            busy.discard(lane)
            return (index, lane)

        return run

    outcomes = side_by_side([job(index) for index in range(6)], ["a", "b"])
    results = [outcome.result() for outcome in outcomes]
    assert [index for index, _ in results] == list(range(6)) and clashes == []
    assert {lane for _, lane in results[:2]} == {"a", "b"}  # one job on each lane


def test_a_jobs_error_is_raised_in_its_turn_and_the_other_jobs_finish():
    def job(index):
        def run(lane):
            if index == 1:
                raise ValueError("job 1 failed")
            return index

        return run

    outcomes = side_by_side([job(index) for index in range(4)], ["a", "b"])
    assert outcomes[0].result() == 0
    with pytest.raises(ValueError, match="job 1 failed"):
        outcomes[1].result()
    assert [outcome.result() for outcome in outcomes[2:]] == [2, 3]


def test_lanes_only_where_nothing_measured_while_training_is_reported():
    lanes = lane_count(Config())
    assert 1 <= lanes <= 2
    assert lane_count(Config(dtype="float64")) == 1  # untimed: a ratio from its epochs
    assert lane_count(Config(timing=False)) == 1
    assert lane_count(Config(profile=True)) == 1  # the step split is measured as the trainer finishes
    assert lane_count(Config(trainer_process="shared")) == 1  # one process: nothing to run beside it


@pytest.mark.skipif(lane_count(Config()) < 2, reason="one core: a sweep trains on one lane")
def test_a_timed_sweep_trains_on_two_lanes_and_times_and_judges_every_configuration(tmp_path):
    report_path = tmp_path / "report.json"
    small = [arg for arg in SMALL if arg not in ("--no-timing",)]
    small[small.index("--trainer-process") + 1] = "own"
    result = run_here(*small, "--sweep-devices", "2", "--json", str(report_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "sweep: 3 configurations trained 2 at a time, then each timed alone" in result.stdout.splitlines()
    sweep = read_report(report_path)["sweep"]
    assert [(e["mesh"], e["shard_weights"], e["update"]) for e in sweep] == [
        ("batch=2", False, ""),  # the main run's
        ("batch=2", True, ""),
        ("batch=1,model=2", False, ""),
        ("", False, "primary"),  # the main run's
        ("", False, "replicas"),
    ]
    for entry in sweep:
        assert (entry["verdict"], entry["parity_ok"]) == ("ok", True)
        assert entry["measured_steps"] >= 30 and entry["ratio_spread"][0] <= entry["ratio_to_reference"]
