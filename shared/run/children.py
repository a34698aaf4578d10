"""The processes a run starts (trainer processes, --clients' clients), started one way and stopped whatever ends it.

A child runs in a session of its own, so a terminal's Ctrl-C reaches the run alone, which then stops it; its lines
show where this process's do (shared/console.py shown_descriptor). Stopping is SIGTERM to its process group, then
SIGKILL after GRACE_S; every child still running is stopped at exit, and by compare.py and check_model on Ctrl-C.
"""

import atexit
import ctypes
import os
import signal
import subprocess
import time
from typing import Iterable, Mapping, Sequence

from dtensor_vs_mirrored import IMPORT_ROOT
from dtensor_vs_mirrored.shared.console import shown_descriptor

# From SIGTERM to SIGKILL, for a child that handles SIGTERM to end well: a trainer process handles none (it ends at
# once); a client's TensorFlow catches it once the client has joined its cluster (/proc/PID/status SigCgt) and runs
# on: with a 5 s grace, an interrupted --clients run took 5.9 s to exit against 2.7 s (2 cores, TF 2.21).
GRACE_S = 1.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h

_live = set()  # every child started and not yet stopped


def start(command: Sequence[str], env: Mapping[str, str], die_with_parent: bool = False, **popen) -> subprocess.Popen:
    """`command` started in a session of its own with the environment `env` (IMPORT_ROOT first on its PYTHONPATH:
    it imports this project by its unique name from any directory), its stderr where this process shows its lines
    unless `popen` says where (subprocess.Popen's keywords). `die_with_parent`: it gets SIGKILL when this
    process dies, even by SIGKILL (Linux); a function runs in the forked child for that, so not from a process whose
    other threads fork too (a sweep's lanes start their trainer processes from theirs)."""
    popen.setdefault("stderr", shown_descriptor())
    preexec = _die_with_parent if die_with_parent else None
    env = dict(env, PYTHONPATH=os.pathsep.join([IMPORT_ROOT, *filter(None, [env.get("PYTHONPATH")])]))
    process = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=preexec, **popen)
    _live.add(process)
    return process


def stop(processes: Iterable[subprocess.Popen], grace_s: float = GRACE_S) -> None:
    """Each of `processes` that still runs terminated (SIGTERM to its process group), all at once, then killed
    (SIGKILL) if still there after `grace_s`; each reaped (its returncode set: its own if it had ended) and its
    pipes closed."""
    processes = list(processes)
    running = [process for process in processes if process.poll() is None]
    _signal(running, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in running:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal([process], signal.SIGKILL)
            process.wait()
    for process in processes:
        process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:  # a broken pipe's unflushed bytes: nothing to deliver them to
                pass
        _live.discard(process)


@atexit.register
def stop_all(grace_s: float = GRACE_S) -> None:
    """Every child still running stopped (stop): at exit, on Ctrl-C, or when a sweep's block is cut short."""
    stop(list(_live), grace_s)


def _signal(processes: Iterable[subprocess.Popen], signum: int) -> None:
    for process in processes:
        try:
            os.killpg(process.pid, signum)  # its session's one group: whatever it started goes with it
        except ProcessLookupError:  # it ended and was reaped meanwhile
            pass


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the process groups and stop_all still apply
