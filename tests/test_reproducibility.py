"""--repeat N and --deterministic: each trainer trained again from the same start, compared bit for bit.

The comparison is tested here on made-up histories; compare.py end to end on a small slice, once
as TensorFlow ships (op determinism off) and once with --deterministic, which must run in a
process of its own (op determinism cannot be turned off again). ~1 minute on 2 cores.
"""

import numpy as np
import pytest

from dtensor_vs_mirrored.shared.judge.repeats import compare_runs
from dtensor_vs_mirrored.shared.measure.history import History
from dtensor_vs_mirrored.shared.run.sequence import TrainerResult
from tests import cli
from tests.cli import read_report, run_compare, run_here, unwrapped


def history(losses=(2.0, 1.5, 1.2, 1.0), weight=0.0):
    return History(
        trainer="dtensor",
        placement="-",
        step_losses=list(losses),
        final_weights=[np.full((3, 2), 0.5, np.float32) + np.float32(weight), np.zeros(2, np.float32)],
        weight_names=["layer 0 weight", "layer 0 bias"],
    )


def test_repeats_equal_to_the_last_bit_are_bitwise_identical():
    found = compare_runs(history(), [TrainerResult("dtensor", history()), TrainerResult("dtensor", history())])
    assert found.bitwise_identical and found.runs == 3 and found.first_differing_step is None
    assert found.line() == "bitwise identical (3 runs)"


def test_a_repeat_that_differs_names_the_first_step_and_the_sizes():
    """The earliest step over every repeat, the largest differences; one ulp of a loss counts."""
    one_ulp = float(np.nextafter(1.2, 2.0))
    repeats = [
        TrainerResult("dtensor", history((2.0, 1.5, one_ulp, 1.0 + 3e-7), weight=2e-6)),
        TrainerResult("dtensor", history((2.0, 1.5, 1.2, 1.0 + 1e-7))),
    ]
    found = compare_runs(history(), repeats)
    assert not found.bitwise_identical and found.first_differing_step == 2
    assert found.max_abs_loss_diff == pytest.approx(3e-7, rel=1e-6) and found.differing_weights == ["layer 0 weight"]
    assert found.line() == "differs from step 2: loss by up to 3e-07, final weights by up to 2e-06 (layer 0 weight)"


def test_final_weights_alone_can_differ():
    found = compare_runs(history(), [TrainerResult("dtensor", history(weight=1e-7))])
    assert found.first_differing_step == 4 and found.line().startswith("losses bit for bit; final weights by up to ")


def test_a_repeat_that_raised_is_reported_as_failed():
    found = compare_runs(history(), [TrainerResult("dtensor", error="RuntimeError: lost a device")])
    assert not found.bitwise_identical and found.line() == "FAILED: RuntimeError: lost a device"


SMALL = [*cli.SMALL, "--quiet"]


@pytest.mark.extended  # --repeat end to end; its judging: the tests above
@pytest.mark.parametrize("deterministic", [False, True])
def test_repeat_2_reports_every_trainer_in_the_table_and_the_json(tmp_path, deterministic):
    """Whether the repeats are identical is a finding (docs/reproducibility.md), so without op determinism
    the test asserts only that the report says one or the other consistently. With it, TensorFlow promises
    the same outputs for the same inputs on the same machine: every trainer must be bitwise identical."""
    report_path = tmp_path / "report.json"
    options = ["--deterministic", "--trainers", "dtensor"] if deterministic else []  # with the reference: 2 trainers
    run = run_compare if deterministic else run_here  # op determinism is for the whole process: a new one
    result = run(*SMALL, "--repeat", "2", *options, "--json", str(report_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    state = "on: --deterministic" if deterministic else "off; --deterministic turns it on"
    assert (
        f"Reproducibility: each trainer trained 2 times from the same start in one process (the header's), "
        f"compared bit for bit (op determinism {state})"
    ) in unwrapped(result.stdout)
    report = read_report(report_path)
    assert report["environment"]["op_determinism"] is deterministic
    found = report["reproducibility"]
    assert found["runs"] == 2 and found["deterministic"] is deterministic
    assert sorted(found["trainers"]) == sorted(["dtensor", "reference"] + ([] if deterministic else ["mirrored"]))
    for name, entry in found["trainers"].items():
        assert f"| {entry['line']}" in result.stdout and entry["runs"] == 2 and entry["error"] == ""
        if entry["bitwise_identical"]:
            assert entry["line"] == "bitwise identical (2 runs)" and entry["first_differing_step"] is None
        else:
            assert not deterministic, f"{name}: {entry['line']}"
            assert entry["first_differing_step"] is not None and entry["line"].startswith(("differs", "losses"))
