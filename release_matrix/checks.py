"""Measure the TensorFlow release installed here: the fast parity tests and short compare.py runs.

    python -m release_matrix.checks --out out/releases/2.16.2.json --install-seconds 13.6

noxfile.py's `release` session runs this in each release's own environment; run it by
hand in any environment where the project is installed. Every check is its own process,
as a user would start it (`compare.py ... --json`, pytest, `release_matrix.stale_read`),
and records its exit code, wall time and figures; `release_matrix.table` turns the files
into docs/releases.md. Costs (2 cores, one release at a time): 400-600 s, of which the fast
tests (2 processes) 150-360 s and each compare.py run 25-75 s. The float64 run is compared with
the report committed in release_matrix/baseline-float64.json (compare.py --baseline).
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from importlib import metadata

from dtensor_vs_mirrored.shared.files import write_atomically

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMBINE_ALL_REDUCES = "DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION"
FAST_MARKER = "fast"  # pytest -m fast: the test modules marked so (pyproject.toml registers it)
# TensorFlow's C++ log lines (and absl's notice about them): not the error a failed check ends with.
LOG_LINE = re.compile(r"^([IWEF]\d{4} |WARNING: All log messages)")
TIMEOUT_SECONDS = 900  # per process; the slowest check (the fast tests) takes 2.5-6 minutes
# 512 embedded examples in batches of 128: 4 steps an epoch, 8 in the 2 epochs.
SMALL = ["--data", "embedded", "--train-examples", "512", "--test-examples", "256", "--epochs", "2"]
STEPS_PER_EPOCH = 4
# name: (compare.py arguments, environment). Each runs the reference too; the exit code is the verdict.
COMPARE_RUNS = {
    # What a new user runs: compare.py's defaults (--data auto: tfds if it can load MNIST, else the
    # embedded images), in small slices; it fails where tensorflow-datasets does not import.
    "defaults": (["--train-examples", "512", "--test-examples", "256", "--epochs", "2"], {}),
    "adam": (SMALL, {}),  # DTensor batch=8 and MirroredStrategy, 8 replicas
    "sgd": (SMALL + ["--optimizer", "sgd"], {}),
    "mesh_2d": (SMALL + ["--trainers", "dtensor", "--mesh", "batch=4,model=2"], {}),
    "dtensor_dataset": (SMALL + ["--trainers", "dtensor", "--dtensor-input", "dataset"], {}),
    # Combining on, as TensorFlow ships it: the tutorial's Adam then reads stale slots (expected exit 1).
    "adam_tutorial": (SMALL + ["--trainers", "dtensor", "--adam", "tutorial"], {COMBINE_ALL_REDUCES: "1"}),
    "multi_client": (
        [
            "--data",
            "embedded",
            "--clients",
            "2",
            "--devices",
            "2",
            "--train-examples",
            "256",
            "--test-examples",
            "64",
            "--epochs",
            "1",
            "--batch-size",
            "64",
        ],
        {},
    ),
}
# Each release's float64 run against one report committed in the repo, made on releases.BASELINE_RELEASE with these
# arguments (`compare.py --quiet <FLOAT64_BASELINE_ARGS> --json release_matrix/baseline-float64.json`):
# how far a release's float64 training run lies from another release's (compare.py --baseline).
BASELINE_PATH = os.path.join("release_matrix", "baseline-float64.json")
FLOAT64_BASELINE_ARGS = SMALL + ["--dtype", "float64"]
# Cross-restore: 1 epoch with checkpoints, then the 2nd epoch by the other trainer from each checkpoint;
# its losses are compared with the uninterrupted "adam" run's 2nd epoch.
RESTORES = {
    "dtensor_to_mirrored": ("dtensor", ["--trainers", "mirrored"]),
    "mirrored_to_dtensor_2d": ("mirrored", ["--trainers", "dtensor", "--mesh", "batch=4,model=2"]),
}


def run_process(args, env=None) -> dict:
    """Run `args` from the project root; exit code, wall seconds and the last stderr line."""
    started = time.perf_counter()
    try:
        done = subprocess.run(
            args,
            cwd=ROOT,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {})),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
        )
        exit_code, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:
        exit_code, stdout, stderr = None, str(expired.stdout or ""), f"timed out after {TIMEOUT_SECONDS} s"
    lines = [line for line in stderr.splitlines() if line.strip() and not LOG_LINE.match(line)]
    return {
        "exit_code": exit_code,
        "seconds": round(time.perf_counter() - started, 1),
        "stderr_tail": lines[-1] if lines else "",
        "stdout": stdout,
    }


def run_compare(name: str, args, env, directory: str) -> dict:
    """compare.py with --json; the run's exit code, time, and each trainer's parity figures and losses."""
    report_path = os.path.join(directory, f"{name}.json")
    result = run_process([sys.executable, "compare.py", "--quiet", *args, "--json", report_path], env)
    del result["stdout"]
    result["args"] = list(args)
    result["env"] = dict(env)
    if not os.path.exists(report_path):
        return result
    with open(report_path) as file:
        report = json.load(file)
    result["ok"] = report["ok"]
    result["data"] = {"source": report["environment"]["data_source"], "reason": report["environment"]["data_reason"]}
    result["parity"] = {
        trainer: {
            key: parity[key]
            for key in ("max_abs_loss_diff", "max_abs_grad_diff", "max_abs_weight_diff", "ok")
            + (("verdict",) if "verdict" in parity else ())
        }
        for trainer, parity in report["parity"].items()
    }
    result["failed_trainers"] = {
        trainer: facts["error"] for trainer, facts in report["trainers"].items() if facts["failed"]
    }
    result["step_losses"] = {
        trainer: facts["step_losses"] for trainer, facts in report["trainers"].items() if not facts["failed"]
    }
    if report.get("baseline"):
        result["baseline"] = {
            trainer: {
                key: (entry["difference"] or {}).get(key)
                for key in ("max_abs_loss_diff", "max_abs_weight_sample_diff", "max_rel_weight_sum_diff")
            }
            | {key: entry[key] for key in ("verdict", "line", "bitwise_identical")}
            for trainer, entry in report["baseline"]["trainers"].items()
        }
    return result


def float64_baseline(directory: str) -> dict:
    """The float64 run against BASELINE_PATH. Where this release's DTensor has no float64 (2.12's
    collectives: compare.py refuses it, exit 2), the reference and MirroredStrategy alone, with the reason."""
    args = FLOAT64_BASELINE_ARGS + ["--baseline", BASELINE_PATH]
    result = run_compare("float64_baseline", args, {}, directory)
    if result["exit_code"] == 2 and "float64" in result["stderr_tail"]:
        without = run_compare("float64_baseline", args + ["--trainers", "mirrored"], {}, directory)
        without["without_dtensor"] = result["stderr_tail"]
        return without
    return result


def max_abs_diff(values, expected) -> float:
    return max(abs(a - b) for a, b in zip(values, expected, strict=True))


def cross_restore(directory: str, uninterrupted: dict) -> dict:
    """Checkpoint after epoch 1, each trainer's epoch 2 from the other's checkpoint, against the whole run."""
    checkpoints = os.path.join(directory, "checkpoints")
    one_epoch = SMALL[:-1] + ["1"]
    result = {"write": run_compare("checkpoint_write", one_epoch + ["--checkpoint-dir", checkpoints], {}, directory)}
    expected = uninterrupted.get("step_losses", {}).get("reference", [])[STEPS_PER_EPOCH:]
    for name, (writer, args) in RESTORES.items():
        run = run_compare(name, SMALL + args + ["--restore", os.path.join(checkpoints, writer)], {}, directory)
        trainer = args[1]
        losses = run.pop("step_losses", {}).get(trainer, [])
        run["trainer"] = trainer
        if losses and len(losses) == len(expected) == STEPS_PER_EPOCH:
            run["max_abs_loss_diff_to_uninterrupted"] = max_abs_diff(losses, expected)
        result[name] = run
    return result


def fast_tests(directory: str) -> dict:
    """The fast parity tests under pytest; counts from its JUnit XML."""
    junit = os.path.join(directory, "junit.xml")
    result = run_process(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "-m", FAST_MARKER]
    )
    stdout = result.pop("stdout")
    result["marker"] = FAST_MARKER
    if os.path.exists(junit):
        suite = ElementTree.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
        result.update(counts, passed=counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"])
        result["failed_tests"] = [
            f"{case.get('classname')}::{case.get('name')}"
            for case in suite.iter("testcase")
            if case.find("failure") is not None or case.find("error") is not None
        ]
    else:
        result["stdout_tail"] = stdout[-2000:]
    return result


def stale_read(combine: str) -> dict:
    """release_matrix.stale_read in its own process (its one JSON line), combining on or off."""
    result = run_process([sys.executable, "-m", "release_matrix.stale_read", "--combine", combine])
    stdout = result.pop("stdout").strip().splitlines()
    if result["exit_code"] == 0 and stdout:
        result.update(json.loads(stdout[-1]))
    return result


def project_commit() -> str:
    """The project's git commit, "+changes" when the working tree differs from it; "-" outside git."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "-"
    return commit + ("+changes" if changed else "")


def versions() -> dict:
    """The installed versions that matter, read from package metadata (no TensorFlow import), and
    the project's commit: the rows of one table may come from different runs."""
    found = {"python": platform.python_version(), "project": project_commit()}
    for package in ("tensorflow", "tensorflow-cpu", "numpy", "keras", "protobuf", "tensorflow-datasets"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return found


def measure(install_seconds=None) -> dict:
    started = time.perf_counter()
    installed = versions()  # before the checks: the commit they run
    with tempfile.TemporaryDirectory(prefix="release-checks-") as directory:
        compare_runs = {name: run_compare(name, args, env, directory) for name, (args, env) in COMPARE_RUNS.items()}
        compare_runs["float64_baseline"] = float64_baseline(directory)
        restore = cross_restore(directory, compare_runs["adam"])
        stale = {"combine_on": stale_read("on"), "combine_off": stale_read("off")}
        tests = fast_tests(directory)
    return {
        "versions": installed,
        "install_seconds": install_seconds,
        "run_seconds": round(time.perf_counter() - started, 1),
        "fast_tests": tests,
        "compare": compare_runs,
        "cross_restore": restore,
        "stale_read": stale,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="write the measurements here as JSON")
    parser.add_argument(
        "--install-seconds",
        type=float,
        default=None,
        help="how long installing the release and the project took (the caller measured it)",
    )
    args = parser.parse_args(argv)
    facts = measure(args.install_seconds)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_atomically(args.out, json.dumps(facts, indent=2).encode())
    print(f"{facts['versions'].get('tensorflow')}: measured in {facts['run_seconds']} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
