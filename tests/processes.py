"""Processes as Linux's /proc shows them, for the tests that check what a run leaves running (test_children.py,
test_interrupt.py)."""

import os
from typing import List, Optional


def stat_fields(pid: int) -> Optional[List[str]]:
    """/proc/PID/stat's fields after the command's name (state, parent pid, ...); None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()
    except OSError:  # it ended while we looked
        return None


def alive(pid: int) -> bool:
    """Running, or stopped: not gone and not a zombie waiting to be reaped."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def children(pid: int) -> List[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat_fields(int(entry))
            if fields is not None and int(fields[1]) == pid:
                found.append(int(entry))
    return found
