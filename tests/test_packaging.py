"""Installs that are not editable work too: a wheel of the project holds every file of its packages that the
source tree tracks (the code of shared/'s layers and the trainers, the embedded MNIST and tiny Shakespeare, the
report's schema, the release baseline), and compare.py trains the MLP and the GPT from it, installed into a fresh
target directory, in another directory. ~19 s on 2 cores: the wheel's build, then one process that trains both."""

import json
import os
import shutil
import subprocess
import sys
import zipfile

from tests.cli import ROOT, check_report

PACKAGES = ("shared", "dtensor_impl", "mirrored_impl", "release_matrix")
SKIPPED = (".git", ".venv", ".nox", "build", "out", "__pycache__", ".pytest_cache", "*.egg-info")


def package_files() -> set:
    """Every file under the packages that git tracks, as a wheel names it; without git, every file on disk."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", *PACKAGES], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode()
        return {name for name in listed.split("\0") if name}
    except (OSError, subprocess.CalledProcessError):  # a source tree without git: what is on disk
        found = set()
        for top in PACKAGES:
            for directory, subdirectories, files in os.walk(os.path.join(ROOT, top)):
                subdirectories[:] = [name for name in subdirectories if name != "__pycache__"]
                found |= {os.path.relpath(os.path.join(directory, name), ROOT).replace(os.sep, "/") for name in files}
        return found


def test_the_expected_files_include_the_data_the_code_loads():
    expected = package_files()
    assert {
        "shared/training/embedded/mnist_5k.npz",
        "shared/training/embedded/tiny_shakespeare_excerpt.txt.gz",
        "shared/report/report.schema.json",
        "release_matrix/baseline-float64.json",
    } <= expected


# Both runs in one process (one TensorFlow start): the MLP's reference and the GPT's, each on a few batches.
RUNS = """
import sys, compare, shared
assert shared.__file__.startswith(sys.argv[1]), shared.__file__
small = ["--trainers", "reference", "--data", "embedded", "--epochs", "1", "--devices", "1", "--no-timing"]
mlp = compare.main([*small, "--train-examples", "128", "--test-examples", "64", "--batch-size", "64",
                    "--json", "mlp.json"])
print("exit", mlp, flush=True)
gpt = compare.main([*small, "--model", "gpt", "--train-examples", "64", "--test-examples", "32", "--batch-size", "32",
                    "--json", "gpt.json"])
print("exit", gpt, flush=True)
"""


def test_a_wheel_holds_every_tracked_file_and_trains_the_mlp_and_the_gpt_from_another_directory(tmp_path):
    source, wheels, site, elsewhere = (tmp_path / name for name in ("source", "wheels", "site", "elsewhere"))
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*SKIPPED))  # the build writes into its tree
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, source], check=True)
    (wheel,) = wheels.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert sorted(package_files() - names) == []
    assert "compare.py" in names

    subprocess.run([*pip, "install", "--no-deps", "--target", site, wheel], check=True)
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))  # before site-packages, where the editable install points here
    done = subprocess.run(
        [sys.executable, "-c", RUNS, str(site)], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.count("exit 0") == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "data: embedded (--data embedded); 128 train, 64 test examples" in done.stdout
    assert "data: embedded (tiny Shakespeare; --data embedded); 64 train, 32 test examples" in done.stdout
    for name in ("mlp", "gpt"):
        report = check_report(json.loads((elsewhere / f"{name}.json").read_text()))
        assert report["ok"] is True and len(report["trainers"]["reference"]["step_losses"]) == 2
    assert report["model"]["name"].startswith("gpt ")
