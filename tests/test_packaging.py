"""Installs that are not editable work too: a wheel of the project holds every package of shared/'s layers,
the embedded MNIST and the report's schema, and compare.py trains from it in another directory. ~40 s."""

import json
import os
import shutil
import subprocess
import sys
import zipfile

from tests.cli import ROOT, check_report

SKIPPED = (".git", ".venv", ".nox", "build", "out", "__pycache__", ".pytest_cache", "*.egg-info")


def source_packages() -> set:
    """Every folder of the source tree with an __init__.py, as a wheel names it (shared/report/...)."""
    found = set()
    for top in ("shared", "dtensor_impl", "mirrored_impl", "release_matrix"):
        for directory, _, files in os.walk(os.path.join(ROOT, top)):
            if "__init__.py" in files:
                found.add(os.path.relpath(directory, ROOT).replace(os.sep, "/"))
    return found


def test_a_wheel_holds_every_layer_and_its_data_and_trains_from_another_directory(tmp_path):
    source, wheels, site, elsewhere = (tmp_path / name for name in ("source", "wheels", "site", "elsewhere"))
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*SKIPPED))  # the build writes into its tree
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, source], check=True)
    (wheel,) = wheels.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"{package}/__init__.py" for package in source_packages()} <= names
    assert {"shared/training/embedded/mnist_5k.npz", "shared/report/report.schema.json", "compare.py"} <= names

    subprocess.run([*pip, "install", "--no-deps", "--target", site, wheel], check=True)
    elsewhere.mkdir()
    code = (
        "import sys, compare, shared; assert shared.__file__.startswith(sys.argv[1]), shared.__file__; "
        "sys.exit(compare.main(sys.argv[2:]))"
    )
    arguments = ["--trainers", "reference", "--data", "embedded", "--train-examples", "128", "--test-examples"]
    arguments += ["64", "--epochs", "1", "--devices", "1", "--batch-size", "64", "--json", "report.json"]
    env = dict(os.environ, PYTHONPATH=str(site))  # before site-packages, where the editable install points here
    done = subprocess.run(
        [sys.executable, "-c", code, str(site), *arguments],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "data: embedded (--data embedded); 128 train, 64 test examples" in done.stdout
    check_report(json.loads((elsewhere / "report.json").read_text()))
