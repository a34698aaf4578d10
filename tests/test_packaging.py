"""Installs that are not editable work too: a wheel of the project holds every file of its packages that the
source tree tracks (the code of shared/'s layers and the trainers, the embedded MNIST and tiny Shakespeare, the
report's schema) under its one import name, dtensor_vs_mirrored, and nothing at the top that a user's own package
could collide with. Installed into a fresh target directory, it trains from a user's repository that has a `shared`
package of its own: check_model (DTensor in its trainer process, started there) and the GPT through the command's
code. ~25 s on 2 cores: the wheel's build, then one process that trains both."""

import json
import os
import shutil
import subprocess
import sys
import zipfile

from tests.cli import ROOT, check_report

PACKAGES = ("shared", "dtensor_impl", "mirrored_impl")  # release_matrix: the repository's tooling, not installed
UNIQUE = "dtensor_vs_mirrored"
SKIPPED = (".git", ".venv", ".nox", "build", "out", "__pycache__", ".pytest_cache", "*.egg-info")


def package_files() -> set:
    """Every file under the packages that git tracks, as a wheel names it (under dtensor_vs_mirrored/); without git,
    every file on disk."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", *PACKAGES, UNIQUE], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode()
        found = {name for name in listed.split("\0") if name}
    except (OSError, subprocess.CalledProcessError):  # a source tree without git: what is on disk
        found = set()
        for top in (*PACKAGES, UNIQUE):
            for directory, subdirectories, files in os.walk(os.path.join(ROOT, top)):
                subdirectories[:] = [name for name in subdirectories if name != "__pycache__"]
                found |= {os.path.relpath(os.path.join(directory, name), ROOT).replace(os.sep, "/") for name in files}
    return {name if name.startswith(UNIQUE + "/") else f"{UNIQUE}/{name}" for name in found}


def test_the_expected_files_include_the_data_the_code_loads():
    expected = package_files()
    assert {
        "dtensor_vs_mirrored/__init__.py",
        "dtensor_vs_mirrored/shared/training/embedded/mnist_5k.npz",
        "dtensor_vs_mirrored/shared/training/embedded/tiny_shakespeare_excerpt.txt.gz",
        "dtensor_vs_mirrored/shared/report/report.schema.json",
    } <= expected


# A user's repository: a package of its own named `shared`, imported first, as their tests would.
USERS_SHARED = {"shared/__init__.py": 'NAME = "the user\'s own shared"\n', "shared/training/__init__.py": ""}
# Both runs in one process (one TensorFlow start): check_model's MLP on DTensor and the GPT's reference, a few batches.
RUNS = """
import sys, shared
assert shared.NAME == "the user's own shared", shared.__file__
from dtensor_vs_mirrored.shared.api import check_model
from dtensor_vs_mirrored.shared import cli
assert cli.__file__.startswith(sys.argv[1]), cli.__file__
check = check_model("mlp", meshes=("batch=2",), trainers=("dtensor",), devices=2, epochs=1, train_examples=128,
                    test_examples=64, batch_size=64, hidden=(32,), timing=False)
print("check", check.ok, sorted(check.verdicts), flush=True)
small = ["--trainers", "reference", "--data", "embedded", "--epochs", "1", "--devices", "1", "--no-timing"]
gpt = cli.main([*small, "--model", "gpt", "--train-examples", "64", "--test-examples", "32", "--batch-size", "32",
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
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {UNIQUE}  # no shared/, compare.py or release_matrix/ at the top of a user's site-packages

    subprocess.run([*pip, "install", "--no-deps", "--target", site, wheel], check=True)
    for name, text in USERS_SHARED.items():
        (elsewhere / name).parent.mkdir(parents=True, exist_ok=True)
        (elsewhere / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=str(site))  # before site-packages, where the editable install points here
    done = subprocess.run(
        [sys.executable, "-c", RUNS, str(site)], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300
    )
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0 and "check True ['dtensor batch=2']" in done.stdout, output
    assert "exit 0" in done.stdout, output
    assert "data: embedded (tiny Shakespeare; --data embedded); 64 train, 32 test examples" in done.stdout
    report = check_report(json.loads((elsewhere / "gpt.json").read_text()))
    assert report["ok"] is True and len(report["trainers"]["reference"]["step_losses"]) == 2
    assert report["model"]["name"].startswith("gpt ")
    command = site / "bin" / "dtensor-vs-mirrored"  # the installed command: its --help without TensorFlow
    shown = subprocess.run([command, "--help"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: compare.py"), shown.stdout + shown.stderr


def test_the_projects_folder_imported_by_its_own_name_says_which_name_to_use():
    """From the clone's root `shared` is this project's folder: imported so, it names the import that works (in a
    user's repository `shared` is theirs, and the project's modules never import it by that name:
    tests/test_imports.py)."""
    done = subprocess.run(
        [sys.executable, "-c", "from shared.api import check_model"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "ImportError: this project's shared/ is imported as dtensor_vs_mirrored.shared "
        "(from dtensor_vs_mirrored.shared.api import check_model), not as shared"
    )
