"""A mixed run on CPU kernels that cannot compute its dtype's matmul is refused in one line before anything trains
(shared/run/kernels.py): on TensorFlow 2.21 oneDNN capped at AVX2 kills the process on a bfloat16 or float16 matmul."""

import os
import subprocess
import sys

import pytest

from dtensor_vs_mirrored.shared.run.kernels import PROBE
from tests.cli import SMALL, run_compare

CAPPED = {"ONEDNN_MAX_CPU_ISA": "AVX2"}


def probe_dies(compute: str) -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, compute], capture_output=True, timeout=120, env={**os.environ, **CAPPED}
    )
    return probe.returncode < 0


# float16's refusal is bfloat16's path with another dtype: extended, to keep the default suite's minutes.
@pytest.mark.parametrize(
    "policy,compute",
    [("mixed_bfloat16", "bfloat16"), pytest.param("mixed_float16", "float16", marks=pytest.mark.extended)],
)
def test_a_mixed_run_whose_matmul_kills_the_process_is_refused_before_anything_trains(tmp_path, policy, compute):
    if not probe_dies(compute):
        pytest.skip(f"ONEDNN_MAX_CPU_ISA=AVX2 leaves this CPU's {compute} matmul running")
    report = tmp_path / "report.json"
    result = run_compare(*SMALL, "--dtype", policy, "--json", report, env=CAPPED)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        f"compare.py: error: --dtype {policy}: this CPU's TensorFlow kernels cannot compute a {compute} matmul (the "
        f"probe process died: SIGSEGV, ONEDNN_MAX_CPU_ISA=AVX2); use float32 or float64, or unset ONEDNN_MAX_CPU_ISA"
    ]
    assert "epoch" not in result.stdout and not report.exists()  # nothing trained, nothing written
