"""Run compare.py in a subprocess, as a user would."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_compare(*args, timeout=300, env=None):
    """compare.py's exit code and output; TensorFlow's own messages hidden as for a user
    (conftest sets TF_CPP_MIN_LOG_LEVEL for this process, which would show them)."""
    env = dict({k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"},
               PYTHONPATH=ROOT, **(env or {}))
    return subprocess.run([sys.executable, os.path.join(ROOT, "compare.py"), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def unwrapped(text: str) -> str:
    """compare.py's output with each log line that shared.console.fit_width broke (a long path, say)
    joined again: a continuation starts with LOG_INDENT spaces."""
    return re.sub(r"\n {11}(?=\S)", " ", text)
