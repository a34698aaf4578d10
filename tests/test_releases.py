"""The supported TensorFlow releases: pyproject's range agrees with the matrix's list, the stale-read
check tells both cases apart, and the release table judges and renders what was measured.

The stale-read test starts TensorFlow twice (162 s for this file on a busy 2-core machine); the rest reads files.
"""

import dataclasses
import json
import os
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from release_matrix import table
from release_matrix.releases import RELEASES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def declared_tensorflow() -> Requirement:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as file:
        dependencies = tomllib.load(file)["project"]["dependencies"]
    [tensorflow] = [Requirement(d) for d in dependencies if Requirement(d).name == "tensorflow"]
    return tensorflow


def test_declared_range_is_exactly_the_matrix_releases():
    specifier = declared_tensorflow().specifier
    bounds = {spec.operator: Version(spec.version) for spec in specifier}
    assert set(bounds) == {">=", "<"}, f"declare tensorflow>=OLDEST,<NEXT, not {specifier}"
    releases = [Version(release) for release in RELEASES]
    assert releases == sorted(releases)
    assert all(len(release.release) == 3 for release in releases), "list full releases, e.g. 2.16.2"
    minors = [release.release[:2] for release in releases]
    assert minors == [(2, minor) for minor in range(minors[0][1], minors[-1][1] + 1)], (
        "one release per minor version, none left out"
    )
    assert bounds[">="] == Version("%d.%d" % minors[0]), "the range starts at the oldest release in the matrix"
    assert bounds["<"] == Version("%d.%d" % (minors[-1][0], minors[-1][1] + 1)), (
        "the range ends right after the newest release in the matrix"
    )
    assert all(specifier.contains(release) for release in releases)


# Off, a read after an assign is what was assigned: every DTensor parity test runs that way (docs/parity.md).
@pytest.mark.parametrize("combine", ["on", pytest.param("off", marks=pytest.mark.extended)])
def test_stale_read_appears_only_with_all_reduce_combining(combine):
    done = subprocess.run(
        [sys.executable, "-m", "release_matrix.stale_read", "--combine", combine],
        cwd=ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["combine_all_reduces"] is (combine == "on")
    assert facts["variables"] == 6 and all(value > 0 for value in facts["max_abs_assigned"])
    if combine == "on":  # TF 2.21: every variable but one reads back zeros
        assert facts["stale_read"] and facts["stale_variables"] == facts["read_zero_variables"] == 5
    else:
        assert not facts["stale_read"] and facts["max_abs_read"] == facts["max_abs_assigned"]


def parity(loss, ok=True):
    return {"max_abs_loss_diff": loss, "max_abs_grad_diff": loss / 10, "max_abs_weight_diff": loss * 3, "ok": ok}


def compare_run(exit_code=0, losses=(2.3, 2.1), **trainers):
    return {
        "exit_code": exit_code,
        "seconds": 20.0,
        "stderr_tail": "",
        "ok": exit_code == 0,
        "parity": trainers,
        "failed_trainers": {},
        "step_losses": {name: list(losses) for name in trainers},
    }


def baseline_entry(verdict="same", loss=0.0, line=None):
    """release_matrix.checks's summary of one trainer in a --baseline report."""
    return {
        "verdict": verdict,
        "line": line or verdict,
        "bitwise_identical": loss == 0.0,
        "max_abs_loss_diff": loss,
        "max_abs_weight_sample_diff": loss * 2,
        "max_rel_weight_sum_diff": loss / 10,
    }


OFFLINE = (
    "auto: MNIST is not prepared in /root/tensorflow_datasets and storage.googleapis.com did not answer within 3 s"
)


def measurement(tutorial_exit=1, dataset_losses=(2.3, 2.1)):
    """The shape release_matrix.checks writes, with figures as a passing release has them."""
    both = {"dtensor": parity(2.4e-7), "mirrored": parity(2.4e-7)}
    return {
        "versions": {"python": "3.11.7", "tensorflow": "2.16.2", "project": "1a2b3c4", "keras": "3.15.1"},
        "install_seconds": 14.0,
        "run_seconds": 300.0,
        "fast_tests": {
            "exit_code": 0,
            "seconds": 200.0,
            "tests": 46,
            "failures": 0,
            "errors": 0,
            "skipped": 0,
            "passed": 46,
            "failed_tests": [],
        },
        "compare": {
            "defaults": {**compare_run(**both), "data": {"source": "embedded", "reason": OFFLINE}},
            "adam": compare_run(**both),
            "sgd": compare_run(**both),
            "mesh_2d": compare_run(dtensor=parity(1e-7)),
            "dtensor_dataset": compare_run(losses=dataset_losses, dtensor=parity(2.4e-7)),
            "adam_tutorial": compare_run(tutorial_exit, dtensor=parity(0.74, ok=tutorial_exit != 1)),
            "multi_client": compare_run(**both),
            "float64_baseline": {
                **compare_run(**both),
                "baseline": {name: baseline_entry() for name in ("reference", "dtensor", "mirrored")},
            },
        },
        "cross_restore": {
            "write": {"exit_code": 0},
            "dtensor_to_mirrored": {**compare_run(mirrored=parity(1e-7)), "max_abs_loss_diff_to_uninterrupted": 1.2e-7},
            "mirrored_to_dtensor_2d": {**compare_run(dtensor=parity(1e-7)), "max_abs_loss_diff_to_uninterrupted": 3e-4},
        },
        "stale_read": {
            "combine_on": {
                "exit_code": 0,
                "stale_read": True,
                "stale_variables": 5,
                "variables": 6,
                "read_zero_variables": 5,
            },
            "combine_off": {"exit_code": 0, "stale_read": False, "stale_variables": 0, "variables": 6},
        },
    }


def test_the_table_runs_on_the_standard_library_alone():
    """nox's table session has no numpy or TensorFlow: the table and the project's constants it imports (the
    float32 bound, the broken-tensorflow_datasets reason) must load without them."""
    blocked = "import sys; sys.modules.update(numpy=None, tensorflow=None, keras=None); import release_matrix.table"
    done = subprocess.run(
        [sys.executable, "-c", blocked],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_table_judges_each_check_from_the_figures():
    row = table.summarize("2.16.2", measurement())
    adam = row["checks"]["DTensor batch=8, Adam"]
    assert adam["ok"] and adam["cell"] == "ok 2.4e-07 / 2.4e-08 / 7.2e-07"
    assert row["checks"]["--adam tutorial caught"]["cell"] == "yes (exit 1, loss 7.4e-01)"
    assert row["checks"]["DTensorDataset"]["ok"] and row["checks"]["multi-client"]["ok"]
    assert row["stale_read"]["cell"] == "yes, 5 of 6 variables (off: 0)"
    assert row["checks"]["fast tests"]["ok"] and row["checks"]["fast tests"]["cell"] == "46/46 in 200 s"
    # 3e-4 after restoring onto the 2-D mesh is beyond the 1e-4 tolerance: the only failure.
    assert row["failed_checks"] == ["checkpoint cross-restore"] and not row["ok"]

    skips = measurement()
    skips["fast_tests"].update(passed=35, skipped=11)  # a release whose DTensor has no float64 all-reduce
    fast = table.summarize("2.12.1", skips)["checks"]["fast tests"]
    assert fast["ok"] and fast["cell"] == "35/46, 11 skipped in 200 s"
    skips["fast_tests"].update(passed=34, failures=1, exit_code=1)
    assert (
        table.summarize("2.12.1", skips)["checks"]["fast tests"]["cell"] == "FAILED 34/46, 11 skipped in 200 s (exit 1)"
    )

    missed = table.summarize("2.16.2", measurement(tutorial_exit=0, dataset_losses=(2.3, 2.2)))
    assert missed["checks"]["--adam tutorial caught"]["cell"].startswith("NO (exit 0")
    assert missed["checks"]["DTensorDataset"]["cell"].endswith("losses differ from pack's")


def test_the_defaults_run_fails_where_tensorflow_datasets_does_not_import():
    """compare.py still exits 0 there (auto falls back to the embedded images), but a user with a
    network would not get tfds: the row fails. Rows measured before the check leave it unjudged."""
    assert (
        table.summarize("2.16.2", measurement())["checks"][table.DEFAULTS_COLUMN]["cell"]
        == "ok 2.4e-07 / 2.4e-07, data embedded (tfds works; no network)"
    )
    broken = measurement()
    broken["compare"]["defaults"]["data"]["reason"] = (
        "auto: tensorflow_datasets does not work here "
        "(AttributeError: module 'tensorflow_datasets' has no attribute 'builder')"
    )
    row = table.summarize("2.16.2", broken)
    assert row["checks"][table.DEFAULTS_COLUMN]["cell"].startswith("FAILED: auto: tensorflow_datasets does not work")
    assert "compare.py defaults (--data auto)" in row["failed_checks"] and row["verdict"] == "FAILED"
    older = measurement()
    del older["compare"]["defaults"]
    row = table.summarize("2.16.2", older)
    assert row["checks"][table.DEFAULTS_COLUMN] == {"ok": None, "cell": "- (not run)"}
    assert table.DEFAULTS_COLUMN not in row["failed_checks"] + row["unfinished_checks"]


def written_row_verdicts(docs):
    return [row["verdict"] for row in json.loads((docs / "releases.json").read_text())["releases"]]


def test_a_fast_test_run_stopped_by_its_time_limit_makes_the_row_incomplete_not_failed():
    measured = measurement()
    measured["cross_restore"]["mirrored_to_dtensor_2d"]["max_abs_loss_diff_to_uninterrupted"] = 1e-7
    assert table.summarize("2.16.2", measured)["verdict"] == "ok"
    measured["fast_tests"] = {"exit_code": None, "seconds": 900.4, "stderr_tail": "timed out after 900 s"}
    row = table.summarize("2.16.2", measured)
    assert (row["verdict"], row["failed_checks"], row["unfinished_checks"]) == ("incomplete", [], ["fast tests"])
    assert row["checks"]["fast tests"]["cell"] == "not finished: timed out after 900 s"


def test_table_writes_a_row_per_release_between_the_markers(tmp_path):
    results, docs = tmp_path / "results", tmp_path / "docs"
    results.mkdir()
    docs.mkdir()
    (results / f"{RELEASES[0]}.json").write_text(json.dumps(measurement()))
    (docs / "releases.md").write_text(f"# Releases\n\nprose before\n\n{table.BEGIN}\nold table\n{table.END}\n\nafter\n")
    assert table.main(["--results", str(results), "--docs", str(docs)]) == 1  # a failed check, the rest unmeasured
    text = (docs / "releases.md").read_text()
    assert text.startswith("# Releases\n\nprose before\n\n") and text.endswith(f"{table.END}\n\nafter\n")
    assert "old table" not in text
    rows = [line for line in text.splitlines() if line.startswith(("| 2.", "| release"))]
    assert rows[0] == "| " + " | ".join(table.HEADERS) + " |"
    assert [row.split(" | ")[0][2:] for row in rows[1:]] == list(RELEASES)
    assert rows[1].startswith(f"| {RELEASES[0]} | 1a2b3c4 | 3.15.1 | FAILED | 14 | 300 | 46/46 in 200 s | ok 2.4e-07")
    assert written_row_verdicts(docs) == ["FAILED"] + ["not measured"] * (len(RELEASES) - 1)
    assert rows[2] == f"| {RELEASES[1]} |  | not measured" + " | " * (len(table.HEADERS) - 3) + " |"
    written = json.loads((docs / "releases.json").read_text())
    assert [row["release"] for row in written["releases"]] == list(RELEASES)
    assert written["releases"][0]["failed_checks"] == ["checkpoint cross-restore"]


def test_the_float64_baseline_column_gives_the_largest_differences_and_fails_on_changed():
    assert table.summarize("2.21.0", measurement())["checks"][table.BASELINE_COLUMN]["cell"] == "same, bit for bit"
    measured = measurement()
    run = measured["compare"]["float64_baseline"]
    run["baseline"]["dtensor"] = baseline_entry(loss=4.4e-16)
    check = table.summarize("2.16.2", measured)["checks"][table.BASELINE_COLUMN]
    assert check["ok"] and check["cell"] == "same 4.4e-16 / 8.8e-16 / 4.4e-17"
    run.update(without_dtensor="compare.py: error: --dtype float64 on DTensor mesh batch=8 needs TensorFlow 2.13")
    del run["baseline"]["dtensor"]
    assert (
        table.summarize("2.12.1", measured)["checks"][table.BASELINE_COLUMN]["cell"]
        == "same, bit for bit; no dtensor (no float64 here)"
    )
    run["baseline"]["mirrored"] = baseline_entry("CHANGED", 1e-3, "CHANGED at step 3: loss 0.5, baseline 0.501")
    run["exit_code"] = 1
    row = table.summarize("2.16.2", measured)
    assert (
        row["checks"][table.BASELINE_COLUMN]["cell"]
        == "CHANGED: mirrored CHANGED at step 3: loss 0.5, baseline 0.501; no dtensor (no float64 here)"
    )
    assert table.BASELINE_COLUMN in row["failed_checks"]
    del measured["compare"]["float64_baseline"]  # measured before the check existed: not judged
    assert table.summarize("2.16.2", measured)["checks"][table.BASELINE_COLUMN] == {"ok": None, "cell": "- (not run)"}


def test_the_committed_baseline_is_a_valid_report_of_the_float64_check_on_the_baseline_release():
    """checks.py compares each release's float64 run with this file: it must be of the same run (else
    compare.py refuses it, exit 2) and of this schema."""
    from dtensor_vs_mirrored.shared import cli as compare
    from dtensor_vs_mirrored.shared.config import Config
    from dtensor_vs_mirrored.shared.judge.baseline import NUMERIC_OPTIONS
    from dtensor_vs_mirrored.shared.report import saved as saved_report
    from release_matrix import checks
    from release_matrix.releases import BASELINE_RELEASE

    saved = saved_report.load(os.path.join(ROOT, checks.BASELINE_PATH))  # as --baseline reads it
    config, _ = compare.config_from_args(compare.build_parser().parse_args(checks.FLOAT64_BASELINE_ARGS))
    defaults = dataclasses.asdict(Config())  # an option added since the baseline's MINOR: its default, as --baseline
    assert {name: saved["config"].get(name, defaults[name]) for name in NUMERIC_OPTIONS} == {
        name: list(value) if isinstance(value, tuple) else value
        for name, value in dataclasses.asdict(config).items()
        if name in NUMERIC_OPTIONS
    }
    assert saved["environment"]["tensorflow"] == BASELINE_RELEASE and saved["ok"] is True
    assert sorted(saved["trainers"]) == ["dtensor", "mirrored", "reference"]
    assert all(not entry["failed"] for entry in saved["trainers"].values())


def test_a_release_not_measured_here_keeps_its_row_from_the_last_table(tmp_path):
    results, docs = tmp_path / "results", tmp_path / "docs"
    results.mkdir()
    docs.mkdir()
    (docs / "releases.md").write_text(f"# Releases\n\n{table.BEGIN}\n{table.END}\n")
    earlier = table.summarize(RELEASES[1], measurement())
    del earlier["checks"][table.BASELINE_COLUMN]  # measured before the column existed
    (docs / "releases.json").write_text(json.dumps({"releases": [earlier]}))
    (results / f"{RELEASES[0]}.json").write_text(json.dumps(measurement()))
    table.main(["--results", str(results), "--docs", str(docs)])
    rows = json.loads((docs / "releases.json").read_text())["releases"]
    assert [row["verdict"] for row in rows[:3]] == ["FAILED", earlier["verdict"], "not measured"]
    assert rows[1]["checks"][table.BASELINE_COLUMN] == {"ok": None, "cell": "- (not run)"}
    assert rows[1]["versions"]["project"] == "1a2b3c4"
