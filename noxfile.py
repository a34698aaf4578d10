"""The TensorFlow release matrix: each supported release in its own environment, then the table; and
the parity tests under each kernel setting that changes float32's rounding.

    python3 -m venv .nox/tools && .nox/tools/bin/pip install "nox[uv]"
    .nox/tools/bin/nox                                 # every release, then docs/releases.md and .json
    .nox/tools/bin/nox -s "release(2.16.2)" table      # one release; the table reuses the others' last files
    .nox/tools/bin/nox -s kernels                      # not in the default run: see below

Session `release(V)`, one per release of release_matrix/releases.py: a fresh environment (uv's, or venv's
without uv) with `tensorflow==V` and the project's test extra (timed), then `python -m release_matrix.checks` into
out/releases/V.json; `table` writes docs/releases.json and .md from them and exits 1 if a release failed a check.
Session `kernels(S)`, one per KERNEL_SETTINGS: the parity tests (PARITY_TESTS, or those after `--`) and
compare.py's default run on the embedded data (out/kernels/S.json) in the setting's environment: kernels decide
where float32 leaves its tolerance, so no test may depend on them. Times: docs/releases.md, docs/parity.md.
"""

import os
import sys
import time

import nox

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from release_matrix.releases import RELEASES
from release_matrix.table import RESULTS_DIR

nox.options.default_venv_backend = "uv|venv"
nox.options.sessions = ["release", "table"]
# oneDNN's instruction-set cap: each gives float32 other roundings on an x86-64 CPU that has more (on one
# without AVX2, "AVX2" is the default). TF_ENABLE_ONEDNN_OPTS=0 and XLA_FLAGS=--xla_cpu_max_isa changed nothing.
KERNEL_SETTINGS = {"default": {}, "SSE41": {"ONEDNN_MAX_CPU_ISA": "SSE41"}, "AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
# Every test file that trains and judges numbers (the multi-client and sweep tests judge the same parity).
PARITY_TESTS = [
    "tests/test_compare.py",
    "tests/test_dtensor.py",
    "tests/test_mirrored.py",
    "tests/test_parity.py",
    "tests/test_baseline.py",
    "tests/test_reproducibility.py",
    "tests/test_checkpoint.py",
]


@nox.session
@nox.parametrize("tensorflow", [nox.param(release, id=release) for release in RELEASES])
def release(session, tensorflow):
    started = time.perf_counter()
    session.install(f"tensorflow=={tensorflow}", "-e", ".[test]")
    install_seconds = time.perf_counter() - started
    session.run(
        "python",
        "-m",
        "release_matrix.checks",
        "--out",
        os.path.join(RESULTS_DIR, f"{tensorflow}.json"),
        "--install-seconds",
        f"{install_seconds:.1f}",
    )


@nox.session(venv_backend="none")
def table(session):
    session.run(sys.executable, "-m", "release_matrix.table")


@nox.session
@nox.parametrize("setting", [nox.param(name, id=name) for name in KERNEL_SETTINGS])
def kernels(session, setting):
    session.install("-e", ".[test]")
    env = KERNEL_SETTINGS[setting]
    session.run("python", "-m", "pytest", *(session.posargs or PARITY_TESTS), env=env)
    os.makedirs(os.path.join("out", "kernels"), exist_ok=True)
    session.run(
        "python",
        "compare.py",
        "--data",
        "embedded",
        "--quiet",
        "--json",
        os.path.join("out", "kernels", f"{setting}.json"),
        env=env,
    )
