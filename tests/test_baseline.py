"""--baseline: a run against a saved report, trainer by trainer: same, float noise or CHANGED; refused with exit 2.

The rules are tested in this process on made-up histories (instant); then compare.py end to end
on a small slice (2 devices, 4 steps): a float64 baseline that the same code repeats, a loss moved
by 1e-3 in a copy of it, an option that changes the numbers, and a float32 baseline with float64
runs (--with-float64) that explain a float32 difference or show a float64 one. ~80 s on 2 cores.
"""

import dataclasses
import json
import re

import numpy as np
import pytest

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.judge import baseline
from dtensor_vs_mirrored.shared.judge.digest import SAMPLE_COUNT, data_sha256, digest, digests
from dtensor_vs_mirrored.shared.measure.history import History
from dtensor_vs_mirrored.shared.report import baseline as baseline_report
from dtensor_vs_mirrored.shared.report import saved
from dtensor_vs_mirrored.shared.report.schema import SCHEMA_VERSION
from dtensor_vs_mirrored.shared.run.sequence import TrainerResult, why_no_float64
from tests import cli
from tests.cli import read_report, run_here, unwrapped

STEPS = 6
NAMES = ["reference", "dtensor", "mirrored"]


def history(name="reference", dtype="float64", loss_shift=(0, 0.0), weight_shift=0.0, losses=None):
    """A made-up run: STEPS losses, a 30x20 weight and its bias; `loss_shift` (step, by) moves one loss."""
    rng = np.random.default_rng(7)
    values = [rng.normal(size=(30, 20)).astype(dtype) + weight_shift, rng.normal(size=20).astype(dtype)]
    step_losses = list(losses if losses is not None else np.linspace(2.0, 0.5, STEPS))
    step, by = loss_shift
    step_losses[step] += by
    return History(
        trainer=name,
        placement="-",
        step_losses=step_losses,
        final_weights=values,
        dtype=dtype,
        weight_names=["layer 0 weight", "layer 0 bias"],
    )


def saved_report(histories, float64_histories=None, config=None, data=None):
    """What compare.py --json keeps of `histories`, as --baseline reads it."""
    report = {
        "schema_version": SCHEMA_VERSION,
        "config": dataclasses.asdict(config or Config()),
        "environment": {"tensorflow": "2.21.0", "devices": ["CPU:0", "CPU:1"]},
        "trainers": {
            h.trainer: {"failed": False, "step_losses": [float(v) for v in h.step_losses], "final_weights": digests(h)}
            for h in histories
        },
        "float64_rerun": None,
    }
    if float64_histories:
        report["float64_rerun"] = {
            "step_losses": {h.trainer: list(h.step_losses) for h in float64_histories},
            "final_weights": {h.trainer: digests(h) for h in float64_histories},
        }
    if data is not None:
        report["environment"].update(
            train_examples=len(data.y_train),
            test_examples=len(data.y_test),
            data_source=data.source,
            data_sha256=data_sha256(data),
        )
    return report


def judged(histories, saved, dtype="float64", float64_runs=None, why_no_float64=""):
    """shared.judge.baseline as the run layer calls it: judge, train the float64 runs it names (`float64_runs`;
    None: none may be asked for), explain."""
    result = baseline.judge({h.trainer: h for h in histories}, saved, "a.json", dtype)
    wanted = baseline.float64_needed(result)
    if float64_runs is None and wanted and not why_no_float64:
        raise AssertionError(f"no float64 run was needed, yet one was asked for {wanted}")
    runs = float64_runs(wanted) if wanted and not why_no_float64 else {}
    baseline.explain_pending(result, runs, why_no_float64)
    return result


def test_a_run_identical_to_its_baseline_is_the_same_bit_for_bit():
    runs = [history(name) for name in NAMES]
    result = judged(runs, saved_report(runs))
    assert [v.line() for v in result.verdicts.values()] == ["same (bit for bit)"] * 3
    assert result.ok and baseline_report.last_line(result) == "BASELINE SAME (bit for bit)"


def test_within_the_float64_tolerance_is_the_same_but_not_bit_for_bit():
    """1e-9 on a loss of ~1 and 1e-9 on every weight: inside float64's 1e-7 + 1e-7 |x| (weights 1e-6)."""
    result = judged([history(loss_shift=(2, 1e-9), weight_shift=1e-9)], saved_report([history()]))
    verdict = result.verdicts["reference"]
    assert verdict.line() == "same" and not verdict.difference.bitwise_identical
    assert verdict.difference.max_abs_loss_diff == pytest.approx(1e-9, rel=1e-3)
    assert baseline_report.last_line(result) == "BASELINE SAME"


def test_a_float64_loss_moved_beyond_the_tolerance_is_changed_at_that_step():
    moved = history("dtensor", loss_shift=(3, 1e-3))
    result = judged([history(), moved], saved_report([history(), history("dtensor")]))
    verdict = result.verdicts["dtensor"]
    assert verdict.verdict == baseline.CHANGED and verdict.first_changed_step == 3
    assert verdict.line() == (
        f"CHANGED at step 3: loss {moved.step_losses[3]:.8g}, baseline {moved.step_losses[3] - 1e-3:.8g} (diff 0.001)"
    )
    assert not result.ok and baseline_report.last_line(result) == "BASELINE CHANGED (dtensor)"


def test_a_change_in_one_weight_anywhere_is_changed_in_the_final_weights():
    """One element, moved by 1e-3, that no sample covers: its array's sums move beyond float64's 1e-7 relative."""
    changed = history()
    index = next(
        i
        for i in range(changed.final_weights[0].size)
        if i not in digest("w", changed.final_weights[0])["sample_indices"]
    )
    changed.final_weights[0].reshape(-1)[index] += 1e-3
    result = judged([changed], saved_report([history()]))
    verdict = result.verdicts["reference"]
    assert re.fullmatch(
        r"CHANGED in the final weights: layer 0 weight \(samples up to 0 apart, sums rel [\d.e+-]+\)", verdict.line()
    ), verdict.line()
    assert verdict.first_changed_step == STEPS and verdict.difference.weights_beyond == ["layer 0 weight"]


def float32_case(float64_by=0.0, baseline_float64=True):
    """A float32 run whose reference loss sits 1e-3 from the baseline's at step 2; the float64 runs of
    both sides agree unless the current one is moved by `float64_by`."""
    runs = [history(name, "float32") for name in NAMES]
    saved = [history(name, "float32", loss_shift=(2, 1e-3) if name == "reference" else (0, 0.0)) for name in NAMES]
    float64_saved = [history(name) for name in NAMES] if baseline_float64 else None
    asked = []

    def float64_runs(names):
        asked.extend(names)
        return {name: TrainerResult(name, history(name, loss_shift=(4, float64_by))) for name in names}

    result = judged(runs, saved_report(saved, float64_saved), "float32", float64_runs)
    return result, asked


def test_float32_beyond_its_tolerance_is_float_noise_when_both_float64_runs_agree():
    result, asked = float32_case()
    assert asked == ["reference"]  # only the trainer beyond float32's tolerance needs its float64 run
    verdict = result.verdicts["reference"]
    assert verdict.verdict == baseline.FLOAT_NOISE and result.ok
    assert verdict.line().startswith(
        "float noise: float32 left its tolerance at step 2 (loss diff up to 0.001 at "
        f"step 2); float64 agrees with the baseline's float64 run on all {STEPS} steps"
    )
    assert verdict.float64.bitwise_identical and verdict.float64.dtype == "float64"
    assert baseline_report.last_line(result) == "BASELINE SAME (float noise: reference)"


def test_float32_beyond_its_tolerance_is_changed_when_the_float64_runs_disagree():
    result, _ = float32_case(float64_by=1e-6)
    verdict = result.verdicts["reference"]
    assert verdict.verdict == baseline.CHANGED and verdict.first_changed_step == 4  # float64's step decides
    assert verdict.line().startswith("CHANGED at step 4: loss ")
    assert verdict.line().endswith(
        "(in float64; float32 left its tolerance at step 2 (loss diff up to 0.001 at step 2))"
    )


def test_float32_beyond_its_tolerance_is_changed_without_a_float64_baseline_and_says_how_to_get_one():
    result, asked = float32_case(baseline_float64=False)
    assert asked == []
    line = result.verdicts["reference"].line()
    assert re.fullmatch(
        r"CHANGED at step 2: loss [\d.]+, baseline [\d.]+ \(diff [\d.e+-]+\) \(float32; the baseline holds no "
        r"float64 run of reference to explain it: save the baseline with --with-float64\)",
        line,
    ), line


def test_without_float64_runs_here_the_reason_is_given():
    runs = [history(name, "float32") for name in NAMES]
    saved = [history(name, "float32", loss_shift=(1, 1e-3)) for name in NAMES]
    why = why_no_float64(Config(restore="/ckpt/reference"))
    result = judged(runs, saved_report(saved, [history(n) for n in NAMES]), "float32", why_no_float64=why)
    assert (
        result.verdicts["dtensor"]
        .line()
        .endswith(
            "(float32; no float64 run here: --restore starts from float32 state, which a float64 run cannot restore)"
        )
    )


def test_trainers_missing_or_failed_on_either_side_are_not_compared_and_do_not_fail():
    saved = saved_report([history(), history("dtensor")])
    saved["trainers"]["dtensor"] = {"failed": True, "error": "RuntimeError: x"}
    result = judged([history(), history("dtensor"), history("mirrored")], saved)
    assert {name: v.line() for name, v in result.verdicts.items()} == {
        "reference": "same (bit for bit)",
        "dtensor": "not compared: failed in the baseline",
        "mirrored": "not compared: not in the baseline",
    }
    assert result.ok


@pytest.fixture
def small_data(embedded):
    return dataclasses.replace(
        embedded,
        x_train=embedded.x_train[:512],
        y_train=embedded.y_train[:512],
        x_test=embedded.x_test[:256],
        y_test=embedded.y_test[:256],
    )


def test_options_that_change_the_numbers_are_refused_in_one_line_naming_each(small_data):
    config = Config(dtype="float64", epochs=2)
    saved = saved_report(
        [history()],
        config=config.replace(learning_rate=2e-3, hidden=(700, 400), mesh="batch=4,model=2", devices=4),
        data=small_data,
    )
    with pytest.raises(UsageError) as refused:
        baseline.check_options(saved, config, small_data, data_sha256(small_data), "a.json")
    assert str(refused.value) == (
        "--baseline a.json: its run differs in options that change the numbers: "
        "--learning-rate 0.002 (this run 0.001); --hidden 700,400 (this run 700,500); "
        "run with the baseline's values or save a new baseline"
    )  # mesh, devices: rounding only
    baseline.check_options(
        saved_report([history()], config=config, data=small_data), config, small_data, data_sha256(small_data), "a.json"
    )


def test_other_data_is_refused_by_its_counts_or_its_checksum(small_data):
    config = Config()
    fewer = dataclasses.replace(small_data, x_train=small_data.x_train[:256], y_train=small_data.y_train[:256])
    with pytest.raises(UsageError, match=r": --train-examples 512 \(this run 256\); run with"):
        baseline.check_options(saved_report([history()], data=small_data), config, fewer, data_sha256(fewer), "a.json")
    relabelled = dataclasses.replace(small_data, y_train=np.roll(small_data.y_train, 1), source="/data/mnist")
    with pytest.raises(UsageError, match=r": --data embedded \(this run /data/mnist: other images or labels\); run"):
        baseline.check_options(
            saved_report([history()], data=small_data), config, relabelled, data_sha256(relabelled), "a.json"
        )


def test_an_option_a_baseline_does_not_record_counts_as_its_default(small_data):
    """A report from before an option existed ran with that option's default."""
    saved = saved_report([history()], data=small_data)
    del saved["config"]["shuffle"]
    baseline.check_options(saved, Config(), small_data, data_sha256(small_data), "a.json")
    with pytest.raises(UsageError, match=r"--shuffle False \(this run True\)"):
        baseline.check_options(saved, Config(shuffle=True), small_data, data_sha256(small_data), "a.json")


def test_a_baseline_without_this_runs_trainers_is_refused(small_data):
    saved = saved_report([history("mirrored")], data=small_data)
    saved["trainers"]["reference"] = {"failed": True, "error": "x"}
    with pytest.raises(UsageError) as refused:
        baseline.check_options(saved, Config(trainers=("dtensor",)), small_data, data_sha256(small_data), "a.json")
    assert str(refused.value) == (
        "--baseline a.json: holds none of this run's trainers (it has mirrored, reference); save a baseline of them"
    )


def test_with_float64_cannot_start_from_a_float32_checkpoint():
    from dtensor_vs_mirrored.shared.run.run_options import check_run_options

    with pytest.raises(UsageError) as refused:
        check_run_options(Config(with_float64=True, restore="/ckpt", trainers=("reference",)))
    assert str(refused.value) == (
        "--with-float64 cannot start a float64 run from the float32 checkpoint --restore /ckpt; drop one of them"
    )


@pytest.mark.parametrize(
    "contents, message",
    [
        (None, "--baseline {path}: no such file; give a report that compare.py --json wrote"),
        (
            "{not json",
            "--baseline {path}: not a JSON report (Expecting property name enclosed in double quotes: line 1 "
            "column 2 (char 1))",
        ),
        ('{"ok": true}', "--baseline {path}: not a compare.py report (no config, environment and trainers)"),
        (
            '{"config": {}, "environment": {}, "trainers": {}}',
            "--baseline {path}: written before reports had a schema_version; save it again with this compare.py "
            "(schema "
            f"{SCHEMA_VERSION})",
        ),
        (
            '{"schema_version": "3.0", "config": {}, "environment": {}, "trainers": {}}',
            "--baseline {path}: schema_version 3.0, this compare.py reads 2.x (docs/report-changelog.md); "
            "save it again "
            "with this compare.py",
        ),
    ],
)
def test_a_file_that_is_not_a_report_of_this_major_version_is_refused(tmp_path, contents, message):
    path = tmp_path / "a.json"
    if contents is not None:
        path.write_text(contents)
    with pytest.raises(UsageError) as refused:
        saved.load(str(path))
    assert str(refused.value) == message.format(path=path)


def test_the_digest_sums_exactly_samples_evenly_and_hashes_every_bit():
    values = np.array([[1e16, 1.0], [-1e16, 3.0]])
    found = digest("w", values)
    assert (found["sum"], found["sum_abs"]) == (4.0, 2e16 + 4.0)  # exactly rounded (a running sum gives 2.0 or 4.0)
    assert found["sample_indices"] == [0, 1, 2, 3] and found["sample_values"] == [1e16, 1.0, -1e16, 3.0]
    assert digest("w", np.zeros(1000))["sample_indices"] == [0, 143, 285, 428, 571, 714, 856, 999]
    assert len(digest("w", np.zeros(1000))["sample_indices"]) == SAMPLE_COUNT
    flipped = values.copy()
    flipped.view(np.uint64)[1, 1] ^= 1  # the last bit of one value
    assert digest("w", flipped)["sha256"] != found["sha256"]


# --- end to end: compare.py ----------------------------------------------------------------------

SMALL = [*cli.SMALL, "--quiet"]
SMALL64 = SMALL + ["--dtype", "float64"]


@pytest.fixture(scope="module")
def float64_baseline(tmp_path_factory):
    path = tmp_path_factory.mktemp("baseline") / "a.json"
    result = run_here(*SMALL64, "--json", str(path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return path


def test_the_same_float64_run_against_its_own_report_is_the_same_for_every_trainer(float64_baseline, tmp_path):
    result = run_here(*SMALL64, "--baseline", str(float64_baseline), "--json", str(tmp_path / "b.json"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.rstrip().splitlines()
    assert lines[-2] == "PARITY OK" and lines[-1].startswith("BASELINE SAME")
    assert f"Against the baseline {float64_baseline} (TensorFlow 2." in unwrapped(result.stdout)
    found = read_report(tmp_path / "b.json")["baseline"]
    assert found["ok"] is True and found["tolerances"]["loss"] == [1e-7, 1e-7]
    assert {name: entry["verdict"] for name, entry in found["trainers"].items()} == dict.fromkeys(NAMES, "same")


def test_a_loss_moved_by_1e_3_in_the_baseline_is_changed_at_that_step_exit_1(float64_baseline, tmp_path):
    saved = json.loads(float64_baseline.read_text())
    saved["trainers"]["mirrored"]["step_losses"][2] += 1e-3
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(saved))
    result = run_here(*SMALL64, "--baseline", str(moved), "--json", str(tmp_path / "b.json"))
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.rstrip().splitlines()[-2:] == ["PARITY OK", "BASELINE CHANGED (mirrored)"]
    row = next(line for line in result.stdout.splitlines() if line.startswith("| mirrored") and "CHANGED" in line)
    assert "| CHANGED at step 2: loss " in row and "(diff 0.001)" in row
    report = read_report(tmp_path / "b.json")
    assert report["ok"] is False and report["baseline"]["trainers"]["mirrored"]["first_changed_step"] == 2
    assert [report["baseline"]["trainers"][name]["verdict"] for name in ("reference", "dtensor")] == ["same"] * 2


def test_a_baseline_with_another_learning_rate_is_refused_before_anything_trains(float64_baseline, tmp_path):
    result = run_here(
        *SMALL64, "--learning-rate", "2e-3", "--baseline", str(float64_baseline), "--json", str(tmp_path / "b.json")
    )
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        f"compare.py: error: --baseline {float64_baseline}: its run differs in options that change the numbers: "
        "--learning-rate 0.001 (this run 0.002); run with the baseline's values or save a new baseline"
    ]
    assert "epoch" not in result.stdout and not (tmp_path / "b.json").exists()


@pytest.mark.extended  # float noise told from a change: tests/test_verdicts.py; baselines: the tests above
def test_a_float32_baseline_with_float64_runs_tells_float_noise_from_a_change(tmp_path):
    """--with-float64 keeps every trainer's float64 run in the report. Against a copy in which the
    reference's float32 loss at step 1 moved by 1e-3 (its float64 run untouched) and dtensor's float32
    and float64 losses both did: reference is float noise, dtensor CHANGED in float64. (The reference and
    DTensor only: MirroredStrategy's float64 runs would add ~15 s and no case.)"""
    saved_path = tmp_path / "a.json"
    result = run_here(*SMALL, "--trainers", "dtensor", "--with-float64", "--json", str(saved_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    saved = read_report(saved_path)
    record = saved["float64_rerun"]
    assert record["explained"] == [] and record["seconds"] == 0 and record["more_seconds"] > 0
    assert sorted(record["step_losses"]) == sorted(record["final_weights"]) == ["dtensor", "reference"]
    assert all(entry["dtype"] == "float64" for entry in record["final_weights"]["dtensor"])
    saved["trainers"]["reference"]["step_losses"][1] += 1e-3
    saved["trainers"]["dtensor"]["step_losses"][1] += 1e-3
    record["step_losses"]["dtensor"][1] += 1e-3
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(saved))

    result = run_here(*SMALL, "--trainers", "dtensor", "--baseline", str(moved), "--json", str(tmp_path / "b.json"))
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    lines = {
        line.split("|")[1].strip(): line.split("|")[-2].strip()
        for line in result.stdout.splitlines()
        if line.startswith("| ") and line.split("|")[-2].strip().startswith(("same", "float noise", "CHANGED"))
    }
    assert lines["reference"].startswith(
        "float noise: float32 left its tolerance at step 1 (loss diff up to 0.001 "
        "at step 1); float64 agrees with the baseline's float64 run on all 4 steps"
    )
    assert lines["dtensor"].startswith("CHANGED at step 1: loss ") and lines["dtensor"].endswith(
        "(in float64; float32 left its tolerance at step 1 (loss diff up to 0.001 at step 1))"
    )
    assert result.stdout.rstrip().splitlines()[-1] == "BASELINE CHANGED (dtensor)"
    report = read_report(tmp_path / "b.json")
    assert sorted(report["float64_rerun"]["step_losses"]) == ["dtensor", "reference"]  # trained for the baseline
    assert report["baseline"]["trainers"]["reference"]["float64"]["dtype"] == "float64"
