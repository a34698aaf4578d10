"""The TensorFlow release matrix: each supported release in its own environment, then the table.

    python3 -m venv .nox/tools && .nox/tools/bin/pip install "nox[uv]"
    .nox/tools/bin/nox                                 # every release, then docs/releases.md and .json
    .nox/tools/bin/nox -s "release(2.16.2)" table      # one release; the table reuses the others' last files

Session `release(V)`, one per release of release_matrix/releases.py: a fresh environment
(uv's, or venv's without uv), `tensorflow==V` and the project with its test extra
installed as the README says (timed), then `python -m release_matrix.checks`, which
writes out/releases/V.json. Session `table` turns those files into docs/releases.json and
docs/releases.md and prints the table; it exits 1 if a release failed a check.
Costs per release on 2 cores, one release at a time: 4-6 s to install from uv's cache (13-44 s
cold), 6-8 minutes of checks (360-458 s), so about 70 minutes for the ten (docs/releases.md).
"""
import os
import sys
import time

import nox

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from release_matrix.releases import RELEASES  # noqa: E402
from release_matrix.table import RESULTS_DIR  # noqa: E402

nox.options.default_venv_backend = "uv|venv"
nox.options.sessions = ["release", "table"]


@nox.session
@nox.parametrize("tensorflow", [nox.param(release, id=release) for release in RELEASES])
def release(session, tensorflow):
    started = time.perf_counter()
    session.install(f"tensorflow=={tensorflow}", "-e", ".[test]")
    install_seconds = time.perf_counter() - started
    session.run("python", "-m", "release_matrix.checks", "--out", os.path.join(RESULTS_DIR, f"{tensorflow}.json"),
                "--install-seconds", f"{install_seconds:.1f}")


@nox.session(venv_backend="none")
def table(session):
    session.run(sys.executable, "-m", "release_matrix.table")
