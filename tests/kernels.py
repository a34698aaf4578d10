"""Whether this CPU's TensorFlow kernels compute a low-precision matmul: tests of mixed runs skip, in one line, where
they cannot (TensorFlow 2.21's oneDNN capped by ONEDNN_MAX_CPU_ISA=AVX2 or SSE41 kills the process on one)."""

import functools
import subprocess
import sys

import pytest

from dtensor_vs_mirrored.shared.run.kernels import PROBE


@functools.lru_cache(maxsize=None)
def matmul_runs_here(compute: str) -> bool:
    """The project's own probe (shared/run/kernels.py), in a process of its own, under this process's environment."""
    return subprocess.run([sys.executable, "-c", PROBE, compute], capture_output=True, timeout=120).returncode == 0


def require_matmul(compute: str) -> None:
    """Skip the calling test, in one line, where this CPU cannot compute in `compute` (bfloat16 or float16)."""
    if not matmul_runs_here(compute):
        pytest.skip(f"this CPU's kernels crash on a {compute} matmul (try without ONEDNN_MAX_CPU_ISA)")
