"""The processes a run starts (shared/run/children.py): stopped by SIGTERM to their process group, SIGKILL after the
grace for one that stays, every one still running at once by stop_all; each reaped, its pipes closed, forgotten.
Plain Python and shell children, no TensorFlow: ~2 s."""

import os
import signal
import subprocess
import sys
import time

import pytest

from dtensor_vs_mirrored.shared.run import children
from tests.processes import alive

IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " + (
    "time.sleep(60)"
)
# A shell that starts a grandchild and waits for it: stopping the shell's group must end the grandchild too.
WITH_A_GRANDCHILD = "sleep 60 & echo $!; wait"


@pytest.fixture
def own_registry(monkeypatch):
    """stop_all's registry holds this test's children only (the suite's kept trainer processes are not its to stop)."""
    monkeypatch.setattr(children, "_live", set())


def test_a_child_that_stays_after_sigterm_is_killed_after_the_grace(own_registry):
    process = children.start([sys.executable, "-c", IGNORES_SIGTERM], os.environ, stdout=subprocess.PIPE)
    assert process.stdout.readline() == b"ready\n" and children._live == {process}
    assert os.getpgid(process.pid) == process.pid != os.getpgid(0)  # a session of its own: Ctrl-C reaches it not
    started = time.monotonic()
    children.stop([process], grace_s=0.5)
    waited = time.monotonic() - started
    assert process.returncode == -signal.SIGKILL and 0.5 <= waited < 5, (process.returncode, waited)
    assert process.stdout.closed and children._live == set()


def test_stop_all_ends_every_child_and_what_each_started_at_once(own_registry):
    shells = [children.start(["sh", "-c", WITH_A_GRANDCHILD], os.environ, stdout=subprocess.PIPE) for _ in range(2)]
    grandchildren = [int(shell.stdout.readline()) for shell in shells]
    assert all(alive(pid) for pid in grandchildren)
    started = time.monotonic()
    children.stop_all()
    waited = time.monotonic() - started
    assert [shell.returncode for shell in shells] == [-signal.SIGTERM] * 2  # no grace needed: ended at SIGTERM
    assert waited < children.GRACE_S, waited
    deadline = time.monotonic() + 5  # a grandchild is reaped by whoever adopted it
    while any(alive(pid) for pid in grandchildren) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in grandchildren if alive(pid)] and children._live == set()


def test_a_child_that_ended_on_its_own_keeps_its_code(own_registry):
    process = children.start(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGUSR1)"], os.environ
    )
    process.wait()
    children.stop([process])
    assert process.returncode == -signal.SIGUSR1 and children._live == set()
