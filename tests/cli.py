"""Run compare.py in a subprocess, as a user would."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_compare(*args, timeout=300, env=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT, **(env or {}))
    return subprocess.run([sys.executable, os.path.join(ROOT, "compare.py"), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)
