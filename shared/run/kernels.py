"""Whether this CPU's TensorFlow kernels compute the matmul of a mixed run's compute dtype: decided before anything
trains by a probe in a process of its own, since on TensorFlow 2.21 oneDNN kills the process that tries (SIGSEGV)
when its instruction set is capped (ONEDNN_MAX_CPU_ISA=AVX2 or SSE41: bfloat16 and float16 alike), and a trainer
that died so would leave nothing to judge.

The probe imports TensorFlow, ~3 s on 2 cores: compare.py starts it as soon as its arguments are parsed, beside its
own import of TensorFlow, and the run waits for it once its devices are set up, before it loads the model (a Keras
model's load computes under its own policy). Its answer is kept for the process (shared.api.check_model's later
checks), never written down.
"""

import os
import signal
import subprocess
import sys
from typing import Dict, Sequence

from dtensor_vs_mirrored.shared.config import MIXED_COMPUTE
from dtensor_vs_mirrored.shared.errors import UsageError

# A matmul and its gradient in the compute dtype from a float32 weight, as a mixed run's forward and backward take it.
PROBE = """
import sys
import tensorflow as tf
dtype = tf.as_dtype(sys.argv[1])
w = tf.Variable(tf.ones((8, 8)))
with tf.GradientTape() as tape:
    y = tf.cast(tf.matmul(tf.ones((4, 8), dtype), tf.cast(w, dtype)), tf.float32)
tape.gradient(y, w).numpy()
"""
PROBE_SECONDS = 120  # a TensorFlow import on a loaded machine; past it the probe counts as failed
_running: Dict[str, subprocess.Popen] = {}  # compute dtype -> its probe, started
_answers: Dict[str, str] = {}  # compute dtype -> why its probe failed ("" it computed)


def probed_dtype(config) -> str:
    """The compute dtype `config`'s run needs probed: a mixed one on CPUs; "" for any other run."""
    return MIXED_COMPUTE.get(config.dtype, "") if config.device_type.upper() != "GPU" else ""


def start(config) -> None:
    """Start the probe of `config`'s compute dtype, unless it needs none or one ran or runs in this process."""
    compute = probed_dtype(config)
    if compute and compute not in _answers and compute not in _running:
        environment = {**os.environ, "CUDA_VISIBLE_DEVICES": "-1", "TF_CPP_MIN_LOG_LEVEL": "3"}
        _running[compute] = subprocess.Popen(
            [sys.executable, "-c", PROBE, compute], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=environment
        )


def check(config, devices: Sequence[str]) -> None:
    """UsageError in one line when the run computes on CPUs in a dtype whose probe failed (started now if not
    before, and waited for)."""
    compute = probed_dtype(config)
    if not compute or not all(device.upper().startswith("CPU") for device in devices):
        return
    start(config)
    if compute in _running:
        _answers[compute] = wait(_running.pop(compute))
    if _answers[compute]:
        capped = os.environ.get("ONEDNN_MAX_CPU_ISA")
        raise UsageError(
            f"--dtype {config.dtype}: this CPU's TensorFlow kernels cannot compute a {compute} matmul "
            f"({_answers[compute]}{f', ONEDNN_MAX_CPU_ISA={capped}' if capped else ''}); use float32 or float64"
            + (", or unset ONEDNN_MAX_CPU_ISA" if capped else "")
        )


def wait(process: subprocess.Popen) -> str:
    """Why the probe failed, "" when it computed."""
    try:
        _, stderr = process.communicate(timeout=PROBE_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return f"the probe process took over {PROBE_SECONDS} s"
    if process.returncode < 0:
        return f"the probe process died: {signal.Signals(-process.returncode).name}"
    last = [line for line in stderr.decode(errors="replace").splitlines() if line.strip()][-1:]
    return "" if process.returncode == 0 else f"the probe process failed: {last[0] if last else process.returncode}"
