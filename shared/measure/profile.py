"""The step profile (--profile): where a train step's time goes, and what its collectives send.

After a trainer's run (its figures all recorded), `measure` runs its steady train call (`StepCall`: the
call a measured epoch makes, its input preparation apart) once to warm up, counts the call's bytes
(shared/measure/traffic.py), then traces calls of at least PROFILED_STEPS steps with TensorFlow's profiler (the
trace TensorBoard opens) and splits their wall time into PARTS by the ops that ran: the name scopes the
train steps put them in, collectives by op type. Costs a few seconds per trainer; the trainer's weights
are stepped on. What each part holds and what it cannot separate: docs/throughput.md.
"""

import dataclasses
import glob
import math
import os
import re
import tempfile
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from dtensor_vs_mirrored.shared.measure.traffic import Traffic

# Name scopes the train steps open; a backward op is TensorFlow's "gradient_tape/<forward op>".
FORWARD_SCOPE, UPDATE_SCOPE, INPUT_SCOPE, COLLECTIVES_SCOPE = "forward", "optimizer_update", "step_input", "collectives"
BACKWARD_SCOPE = "gradient_tape"
PARTS = ("forward", "backward", "collectives", "update", "input", "other")
# Ops that move data between devices: collectives, and the send/receive pairs of a cross-device copy.
COLLECTIVE_OP = re.compile(r"^(Collective\w*|Nccl\w*|_Send|_Recv|_HostSend|_HostRecv)$")
TF_OP_EVENT = re.compile(r"^(?P<name>[^\s:]+):(?P<type>[A-Za-z_]\w*)$")  # the executor's per op: "scope/name:Type"
# An XLA computation runs as one event without an op name; the only one the trainers compile is the
# update (shared.training.optim.apply_gradients_fused).
XLA_RUN_EVENT = re.compile(r"Executable::ExecuteAsyncOnStream$")
PROFILED_STEPS = 8  # at least this many steps are traced, in whole calls
PREPARE_MARK, RUN_MARK = "step_profile_prepare", "step_profile_run"  # our own events around each part of a call


@dataclasses.dataclass
class StepCall:
    """One train call as a measured epoch makes it; each trainer's `step_call()` returns one."""

    steps: int  # train steps the call runs
    prepare: Callable[[], object]  # the host work that makes the call's inputs (counted as input)
    run: Callable[[object], None]  # the call on those inputs; returns when its last step has run
    notes: str = ""  # what the profiled call does otherwise than training's (e.g. pack for DTensorDataset)
    examples: int = 0  # training examples in its steps (shared/measure/timing.py's examples/s)


@dataclasses.dataclass
class StepProfile:
    steps: int  # train steps traced
    calls: int
    step_ms: float  # wall time per step over the traced calls, their input preparation included
    parts_ms: Dict[str, float]  # per step, one entry per PARTS; they add up to step_ms
    collective_ops_per_step: Dict[str, float]  # by op type, all devices: collectives and cross-device copies
    notes: str = ""


def part_of(op_name: str, op_type: str) -> str:
    """The PARTS entry of one op, by its type (collectives) and the name scopes in its name."""
    scopes = op_name.split("/")
    if COLLECTIVE_OP.match(op_type) or COLLECTIVES_SCOPE in scopes:
        return "collectives"
    if BACKWARD_SCOPE in scopes:
        return "backward"
    for part, scope in (("update", UPDATE_SCOPE), ("forward", FORWARD_SCOPE), ("input", INPUT_SCOPE)):
        if any(re.fullmatch(rf"{scope}(_\d+)?", name) for name in scopes):  # TensorFlow numbers a reopened scope
            return part
    return "other"


def measure(
    call: StepCall, count_bytes: Callable[[], Tuple[Optional[Traffic], str]]
) -> Tuple[StepProfile, Optional[Traffic], str]:
    """(the step profile, bytes per step or None, why not) of `call`, traced over whole calls; `count_bytes`
    counts them in the functions the warm call traced."""
    call.run(call.prepare())  # warm: every function it calls is traced, lowered and compiled
    traffic, why = count_bytes()
    calls = max(1, math.ceil(PROFILED_STEPS / call.steps))
    with tempfile.TemporaryDirectory(prefix="step-profile-") as logdir:
        tf.profiler.experimental.start(
            logdir,
            tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0, device_tracer_level=1),
        )
        try:
            for _ in range(calls):
                with tf.profiler.experimental.Trace(PREPARE_MARK):  # the windows, in the trace's own clock
                    inputs = call.prepare()
                with tf.profiler.experimental.Trace(RUN_MARK):
                    call.run(inputs)
        finally:
            tf.profiler.experimental.stop()
        events, marks, collective_starts = host_events(_newest_trace(logdir))
    steps = calls * call.steps
    seconds = attribute(events, marks[RUN_MARK])
    parts_ms = {part: seconds.get(part, 0.0) * 1e3 / steps for part in PARTS}
    parts_ms["input"] += sum(end - start for start, end in marks[PREPARE_MARK]) / 1e6 / steps
    counts = defaultdict(int)
    for start, op_type in collective_starts:
        if any(low <= start < high for low, high in marks[RUN_MARK]):
            counts[op_type] += 1
    return (
        StepProfile(
            steps,
            calls,
            sum(parts_ms.values()),
            parts_ms,
            {op_type: count / steps for op_type, count in sorted(counts.items())},
            call.notes,
        ),
        traffic,
        why,
    )


def _newest_trace(logdir: str) -> str:
    paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise RuntimeError(f"TensorFlow's profiler wrote no trace under {logdir}")
    return max(paths, key=os.path.getmtime)


def host_events(path: str):
    """The trace's op events per host thread, [(start ns, end ns, part)] in start order (XLA runs count as
    update); the (start, end) of each PREPARE_MARK and RUN_MARK; and (start, op type) of each collective op."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as file:
        space.ParseFromString(file.read())
    lines, marks, collective_starts = [], {PREPARE_MARK: [], RUN_MARK: []}, []
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        parts, mark_ids, collective_types = {}, {}, {}
        for key, metadata in plane.event_metadata.items():
            match = TF_OP_EVENT.match(metadata.name)
            if match:
                parts[key] = part_of(match["name"], match["type"])
                if COLLECTIVE_OP.match(match["type"]):
                    collective_types[key] = match["type"]
            elif XLA_RUN_EVENT.search(metadata.name):
                parts[key] = "update"
            elif metadata.name in marks:
                mark_ids[key] = metadata.name
        for line in plane.lines:
            base_ps = line.timestamp_ns * 1000
            for event in line.events:
                start_ps = base_ps + event.offset_ps
                if event.metadata_id in mark_ids:
                    marks[mark_ids[event.metadata_id]].append(
                        (start_ps // 1000, (start_ps + event.duration_ps) // 1000)
                    )
                elif event.metadata_id in collective_types:
                    collective_starts.append((start_ps // 1000, collective_types[event.metadata_id]))
            events = sorted(
                (
                    (base_ps + event.offset_ps, base_ps + event.offset_ps + event.duration_ps, parts[event.metadata_id])
                    for event in line.events
                    if event.metadata_id in parts
                ),
                key=lambda event: (event[0], -event[1]),
            )  # an enclosing event before those it holds
            if events:
                lines.append([(start // 1000, end // 1000, part) for start, end, part in events])
    return lines, marks, collective_starts


def exclusive(events: List[Tuple[int, int, str]]) -> List[Tuple[int, int, str]]:
    """One thread's nested events as non-overlapping pieces, each time to the innermost event running."""
    pieces, stack = [], []  # stack: [end, part, start of its current piece]
    for start, end, part in events:
        while stack and stack[-1][0] <= start:
            closed = stack.pop()
            pieces.append((closed[2], closed[0], closed[1]))
            if stack:
                stack[-1][2] = closed[0]
        if stack:
            pieces.append((stack[-1][2], start, stack[-1][1]))
            end = min(end, stack[-1][0])
        stack.append([end, part, start])
    while stack:
        closed = stack.pop()
        pieces.append((closed[2], closed[0], closed[1]))
        if stack:
            stack[-1][2] = closed[0]
    return [piece for piece in pieces if piece[1] > piece[0]]


def attribute(lines: List[List[Tuple[int, int, str]]], windows: List[Tuple[int, int]]) -> Dict[str, float]:
    """Seconds of the `windows` (ns) per part.

    At each moment the ops running on all threads share it equally, except collectives, which get
    the moments when nothing else runs: the time a step waits for them (a collective in flight
    while devices compute is hidden behind that compute). Moments with no op running (dispatch,
    waiting for the host) are `other`.
    """
    boundaries = []  # (time ns, +1/-1, part)
    for line in lines:
        for start, end, part in exclusive(line):
            for window_start, window_end in windows:
                low, high = max(start, window_start), min(end, window_end)
                if high > low:
                    boundaries += [(low, 1, part), (high, -1, part)]
    boundaries.sort(key=lambda item: (item[0], item[1]))
    seconds: Dict[str, float] = defaultdict(float)
    active: Dict[str, int] = defaultdict(int)
    for window_start, window_end in windows:
        seconds["other"] += (window_end - window_start) / 1e9  # minus what ops fill, below
    previous = None
    for moment, change, part in boundaries:
        if previous is not None and moment > previous:
            _share(seconds, active, (moment - previous) / 1e9)
        active[part] += change
        previous = moment
    return seconds


def _share(seconds: Dict[str, float], active: Dict[str, int], span_s: float) -> None:
    computing = {part: count for part, count in active.items() if count > 0 and part != "collectives"}
    total = sum(computing.values())
    if total:
        for part, count in computing.items():
            seconds[part] += span_s * count / total
    elif active.get("collectives", 0) > 0:
        seconds["collectives"] += span_s
    else:
        return
    seconds["other"] -= span_s
