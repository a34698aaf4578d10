"""The step profile's and the collectives' part of compare.py's tables and JSON report (--profile, --link-gbps).

Formats what shared/measure/profile.py and shared/measure/traffic.py measured; shared/report/tables.py prints
it and shared/report/document.py writes it.
"""

import dataclasses
from typing import List, Optional, Sequence, Tuple

from dtensor_vs_mirrored.shared.measure.memory import MB
from dtensor_vs_mirrored.shared.measure.profile import PARTS

PART_HEADERS = ["forward", "backward", "coll.", "update", "input", "other", "step ms"]


def implementation_dict(implementation) -> Optional[dict]:
    return None if implementation is None else dataclasses.asdict(implementation)


def traffic_dict(traffic, link_gbps: Optional[float]) -> Optional[dict]:
    """shared.measure.traffic.Traffic as the JSON has it, with the busiest device's bytes and their time at
    --link-gbps."""
    if traffic is None:
        return None
    return {
        **dataclasses.asdict(traffic),
        "link_bytes": traffic.link_bytes,
        "link_floor_ms": traffic.floor_ms(link_gbps),
    }


def profile_dict(step_profile) -> Optional[dict]:
    return None if step_profile is None else dataclasses.asdict(step_profile)


def parts(step_profile) -> List[str]:
    """A row's ms per step of each part, and of the whole step."""
    return [f"{step_profile.parts_ms[part]:.2f}" for part in PARTS] + [f"{step_profile.step_ms:.2f}"]


def trainer_rows(histories: Sequence[Tuple[str, object]]) -> List[list]:
    return [
        [name, *parts(history.step_profile)]
        for name, history in histories
        if history is not None and history.step_profile is not None
    ]


def sweep_rows(entries) -> List[list]:
    return [
        [entry.devices, f"{entry.trainer} {entry.label}", *parts(entry.step_profile)]
        for entry in entries
        if entry.step_profile is not None
    ]


TITLE = (
    "Step profile (--profile), ms per step: the wall time of each trainer's steady train call, split by the ops\n"
    "TensorFlow's profiler saw run (coll.: waiting on collectives; docs/throughput.md)"
)


def traffic_lines(named: Sequence[Tuple[str, object, str]], link_gbps: Optional[float]) -> List[str]:
    """Under a profile table, one line per row: its collectives (count, kind, group, MB each device hands
    in), what the busiest device sends or receives per step, and that at --link-gbps."""
    lines = []
    for name, traffic, missing in named:
        if traffic is None:
            if missing:
                lines.append(f"{name}: bytes not counted: {missing}")
            continue
        floor = traffic.floor_ms(link_gbps) if traffic.link_bytes else None
        lines.append(
            f"{name}: {traffic.describe()}"
            + (f"; {traffic.link_bytes / MB:.2f} MB/step on the busiest link" if traffic.link_bytes else "")
            + (f", >= {floor:.3f} ms at {link_gbps:g} Gb/s" if floor is not None else "")
        )
    return lines
