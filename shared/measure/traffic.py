"""Bytes each device sends and receives per training step, counted in the functions that ran (--profile).

DTensor counts the collectives of what it lowered a train call to (dtensor_impl/traffic.py); here, for
MirroredStrategy and the reference, every tensor the step's graph hands from one device to another
(gradients reduced to one device, results broadcast back, weights copied to replicas). Link bytes count
a ring all-reduce, as NCCL runs it (2 (g-1)/g of the tensor out and in per device), and copies as they
are; `floor_ms` turns the busiest device's bytes into the time a link of a given bandwidth needs at
least. What it assumes and what it leaves out: docs/throughput.md.
"""

import dataclasses
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from dtensor_vs_mirrored.shared.measure.memory import MB

# Collective ops as TensorFlow names them, by what they do. Each device hands in its own tensor.
COLLECTIVE_KINDS = {
    "CollectiveReduceV2": "all-reduce",
    "CollectiveReduce": "all-reduce",
    "NcclAllReduce": "all-reduce",
    "CollectiveGatherV2": "all-gather",
    "CollectiveGather": "all-gather",
    "CollectiveAllToAllV2": "all-to-all",
    "CollectiveReduceScatterV2": "reduce-scatter",
}
NOT_DATA = (tf.resource, tf.variant)  # handles, not the values they name: nothing of them crosses a link


@dataclasses.dataclass(frozen=True)
class Implementation:
    """Which implementation a trainer's collectives ran with, and why that one."""

    name: str  # e.g. "NCCL", "ring", "ReductionToOneDevice", "NcclAllReduce", "none"
    nccl: bool
    reason: str  # e.g. "CPUs have no NCCL", "one physical GPU per device", "--no-dtensor-nccl"

    def describe(self) -> str:
        return f"{self.name} ({self.reason})" if self.reason else self.name


ONE_DEVICE = Implementation("none", False, "one device")


@dataclasses.dataclass(frozen=True)
class Collective:
    """Collectives of one kind on one group of devices, per step."""

    kind: str  # all-reduce, all-gather, all-to-all, reduce-scatter; "to one device" / "from one device": copies
    group: str  # DTensor: the mesh axis its groups span ("batch", "model"); copies: the one device ("CPU:0")
    group_size: int  # devices in each group (copies: the one device and those it exchanges with)
    count: int  # tensors per step (copies: per device that exchanges with the one device)
    payload_bytes: int  # what each device hands in per step (copies: what each such device sends or receives)


@dataclasses.dataclass(frozen=True)
class DeviceTraffic:
    device: str
    sent_bytes: int  # per step
    received_bytes: int


@dataclasses.dataclass
class Traffic:
    counted: str  # what was counted, e.g. "the collectives DTensor lowered a call of 4 steps to"
    collectives: List[Collective]
    devices: List[DeviceTraffic]

    @property
    def link_bytes(self) -> int:
        """What the busiest device sends or receives per step (a link is full duplex)."""
        return max((max(d.sent_bytes, d.received_bytes) for d in self.devices), default=0)

    def floor_ms(self, link_gbps: Optional[float]) -> Optional[float]:
        """The least time per step those bytes take over links of `link_gbps` gigabits per second."""
        return None if not link_gbps else self.link_bytes * 8 / (link_gbps * 1e9) * 1e3

    def describe(self) -> str:
        """e.g. "9 all-reduce on batch (3.45 MB per device)", "8 to CPU:0 (3.45 MB per device), 6 from CPU:0
        (3.45 MB per device)":
        tensors per step, and the MB each device hands in (or sends to / receives from the one device)."""
        words = {"to one device": "to", "from one device": "from"}
        return (
            ", ".join(
                f"{c.count} {words.get(c.kind, c.kind + ' on')} {c.group} ({c.payload_bytes / MB:.2f} MB per device)"
                for c in self.collectives
            )
            or "none"
        )


def ring_bytes(kind: str, payload_bytes: float, group_size: int) -> float:
    """Bytes each device of a group sends (and receives) for a collective on `payload_bytes` of input each.

    Bandwidth-optimal algorithms (ring; NCCL's): an all-reduce reduce-scatters then all-gathers,
    2 (g-1)/g of the tensor; an all-gather passes on the g-1 other pieces; a reduce-scatter and an
    all-to-all (g-1)/g.
    """
    share = (group_size - 1) / group_size
    if kind == "all-reduce":
        return 2 * share * payload_bytes
    if kind == "all-gather":
        return (group_size - 1) * payload_bytes
    return share * payload_bytes


def one_device(device: str) -> Traffic:
    return Traffic("one device: no tensor leaves it", [], [DeviceTraffic(device, 0, 0)])


# --- one step's graph: tensors that cross devices ----------------------------------------------


def _short(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device)
    return f"{spec.device_type}:{spec.device_index}" if spec.device_type else ""


class _Placement:
    """Where each op of a traced graph runs: its own device, else a captured value's, else its first
    placed input's (a variable read runs where the variable lives, as TensorFlow's placer puts it).
    A function argument without a device is taken to be where its consumer is."""

    def __init__(self, graph):
        self.captured = {
            internal.op.name: _short(getattr(external, "device", "") or "") for external, internal in graph.captures
        }
        self.memo: Dict[str, str] = {}

    def device(self, op) -> str:
        if op.name not in self.memo:
            self.memo[op.name] = ""  # guards the recursion
            found = _short(op.device) if op.device else ""
            if not found and op.type == "Placeholder":
                found = self.captured.get(op.name, "")
            for tensor in op.inputs if not found else ():
                found = self.device(tensor.op)
                if found:
                    break
            self.memo[op.name] = found
        return self.memo[op.name]


def cross_device_traffic(concrete_function) -> Tuple[Optional[Traffic], str]:
    """(Traffic per step, "") from the tensors that one step's graph hands between devices; (None, why)
    for a tensor of unknown size. Each tensor counts once per device that receives it."""
    graph = concrete_function.graph
    placement = _Placement(graph)
    transfers: Dict[Tuple[str, str], Tuple[str, str, int]] = {}  # (tensor, to) -> (from, to, bytes)
    for op in graph.get_operations():
        destination = placement.device(op)
        for tensor in op.inputs:
            source = placement.device(tensor.op)
            if not source or not destination or source == destination or tensor.dtype in NOT_DATA:
                continue
            if not tensor.shape.is_fully_defined():
                return None, f"{tensor.name} crosses from {source} to {destination} with unknown shape {tensor.shape}"
            transfers[(tensor.name, destination)] = (
                source,
                destination,
                tensor.shape.num_elements() * tensor.dtype.size,
            )
    return copies_traffic(
        list(transfers.values()), sorted({placement.device(op) for op in graph.get_operations()} - {""})
    )


def copies_traffic(transfers: Sequence[Tuple[str, str, int]], devices: Sequence[str]) -> Tuple[Traffic, str]:
    """Traffic of point-to-point copies (from, to, bytes), summed per device; grouped around the one device
    that all of them go to or come from, as a reduce to one device and a broadcast from it do."""
    sent, received = defaultdict(int), defaultdict(int)
    for source, destination, size in transfers:
        sent[source] += size
        received[destination] += size
    hubs = [device for device in devices if all(device in (s, d) for s, d, _ in transfers)]
    collectives = []
    for device in hubs[:1]:
        for kind, mine in (
            ("to one device", lambda s, d, hub=device: d == hub),
            ("from one device", lambda s, d, hub=device: s == hub),
        ):
            chosen = [(s, d, size) for s, d, size in transfers if mine(s, d)]
            others = {s if d == device else d for s, d, _ in chosen}
            if chosen:
                collectives.append(
                    Collective(
                        kind,
                        device,
                        len(others) + 1,
                        len(chosen) // len(others),
                        sum(size for _, _, size in chosen) // len(others),
                    )
                )
    if transfers and not hubs:
        pairs = defaultdict(list)
        for source, destination, size in transfers:
            pairs[(source, destination)].append(size)
        collectives = [
            Collective("copy", f"{source} -> {destination}", 2, len(sizes), sum(sizes))
            for (source, destination), sizes in sorted(pairs.items())
        ]
    return Traffic(
        "the tensors one step's graph hands between devices",
        collectives,
        [DeviceTraffic(device, sent[device], received[device]) for device in devices],
    ), ""
