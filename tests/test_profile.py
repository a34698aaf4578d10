"""The step profile (--profile, shared/measure/profile.py): how a trace's ops become a step's parts, and compare.py's
tables, JSON and plot of it beside the bytes each configuration sends. No timing is asserted: the parts
add up to the step, the trace sees the collectives the lowered function holds, the bytes are exact."""

import json
import re

import pytest

from dtensor_vs_mirrored.shared.console import LINE_WIDTH
from dtensor_vs_mirrored.shared.measure.profile import PARTS, attribute, exclusive, part_of
from tests.cli import PNG_SIZE, png_size, run_here

MS = 1_000_000  # ns


@pytest.mark.parametrize(
    "name, op_type, part",
    [
        ("tf.StatefulPartitionedCall/forward/MatMul", "MatMul", "forward"),
        ("replica_1/forward_1/Relu", "Relu", "forward"),  # TensorFlow numbers a reopened scope
        ("tf.StatefulPartitionedCall/gradient_tape/forward/MatMul/MatMul", "MatMul", "backward"),
        ("gradient_tape/MatMul/MatMul/DTensorAllReduceOp_968192538_1", "CollectiveReduceV2", "collectives"),
        ("while/LoopCond/_151/_41", "_Send", "collectives"),  # a cross-device copy
        ("collectives/update_7/AssignVariableOp", "AssignVariableOp", "collectives"),  # weights copied to a replica
        ("optimizer_update/AssignSubVariableOp", "AssignSubVariableOp", "update"),
        ("update_7/ReadVariableOp", "ReadVariableOp", "other"),  # TensorFlow's own update_N is not ours
        ("while/body/_1/while/step_input/strided_slice", "StridedSlice", "input"),
        ("while/cond/_0/while/Less", "Less", "other"),
    ],
)
def test_each_op_goes_to_its_part_by_type_and_name_scope(name, op_type, part):
    assert part_of(name, op_type) == part


def test_nested_events_give_their_time_to_the_innermost():
    events = [(0, 10, "other"), (2, 4, "forward"), (4, 8, "update"), (5, 6, "collectives"), (12, 13, "input")]
    assert exclusive(events) == [
        (0, 2, "other"),
        (2, 4, "forward"),
        (4, 5, "update"),
        (5, 6, "collectives"),
        (6, 8, "update"),
        (8, 10, "other"),
        (12, 13, "input"),
    ]


def test_a_step_waits_on_collectives_only_while_nothing_computes():
    """Two threads in a 10 ms window: forward alone 0-2, forward beside a collective 2-4 (the collective is
    hidden), the collective alone 4-5 (the step waits on it), forward and backward together 5-7 (half
    each), nothing 7-10 (other: dispatch, the host)."""
    threads = [
        [(0 * MS, 4 * MS, "forward"), (5 * MS, 7 * MS, "forward")],
        [(2 * MS, 5 * MS, "collectives"), (5 * MS, 7 * MS, "backward")],
    ]
    seconds = attribute(threads, [(0, 10 * MS)])
    assert {part: round(value * 1e3, 9) for part, value in seconds.items() if value} == {
        "forward": 5.0,
        "collectives": 1.0,
        "backward": 1.0,
        "other": 3.0,
    }
    assert attribute(threads, [(0, 2 * MS), (4 * MS, 5 * MS)]) == pytest.approx(
        {"forward": 0.002, "collectives": 0.001, "other": 0.0}
    )


def test_the_profile_and_bytes_of_every_configuration_are_printed_written_and_drawn(tmp_path):
    """The issue's command in small: the run at 1 device, then the sweep at 2 (batch meshes and the default
    update: the others' bytes are tests/test_traffic.py's); every configuration's step parts, its bytes as
    counted (and at 100 Gb/s), and its collective implementation, in the tables, the JSON and step_profile.png."""
    report_path, plots = tmp_path / "report.json", tmp_path / "plots"
    result = run_here(
        "--data",
        "embedded",
        "--train-examples",
        "512",
        "--test-examples",
        "128",
        "--epochs",
        "2",
        "--devices",
        "1",
        "--trainers",
        "dtensor,mirrored",
        "--sweep-devices",
        "2",
        "--sweep-meshes",
        "batch",
        "--profile",
        "--link-gbps",
        "100",
        "--quiet",
        "--json",
        str(report_path),
        "--plots",
        str(plots),
        "--no-timing",  # timed: tests/test_compare.py
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= LINE_WIDTH
    report = json.loads(report_path.read_text())
    assert report["config"]["link_gbps"] == 100 and report["config"]["profile"] is True
    parameters = report["model"]["parameters"]

    rows = {}  # name -> (step profile, traffic, collectives) of each trainer, then each sweep configuration
    for name, trainer in report["trainers"].items():
        rows[name] = trainer["step_profile"], trainer["traffic"], trainer["collectives"]
    for entry in report["sweep"]:
        rows[f"2 devices {entry['trainer']} {entry['mesh'] or 'update ' + entry['update']}"] = (
            entry["step_profile"],
            entry["traffic"],
            entry["collectives"],
        )
    assert len(rows) == 3 + 2
    tables = [
        result.stdout.split(title, 1)[1].split("\n\n", 1)[0].splitlines()
        for title in ("\nStep profile (--profile)", "\nStep profile of every sweep configuration")
    ]
    for name, (profile, traffic, collectives) in rows.items():
        assert set(profile["parts_ms"]) == set(PARTS) and min(profile["parts_ms"].values()) >= 0
        assert sum(profile["parts_ms"].values()) == pytest.approx(profile["step_ms"], rel=1e-9)
        assert profile["steps"] >= 8 and profile["steps"] % profile["calls"] == 0
        assert traffic["link_floor_ms"] == pytest.approx(traffic["link_bytes"] * 8 / 100e9 * 1e3)
        table = tables[0] if name in report["trainers"] else tables[1]
        table_row = next(line for line in table if f"| {name.split('2 devices ')[-1]} " in line)
        assert float(table_row.split("|")[-2]) == pytest.approx(profile["step_ms"], abs=0.005)  # step ms, printed
        expected = {
            "reference": ("none", "one device"),
            "dtensor": ("ring", "CPUs have no NCCL"),
            "mirrored": ("ReductionToOneDevice", "CPUs have no NCCL"),
        }
        assert (collectives["name"], collectives["reason"]) == next(
            value for key, value in expected.items() if key in name
        )
    # One device moves nothing; the profile saw no collective there.
    assert rows["reference"][1]["link_bytes"] == 0 and rows["reference"][0]["parts_ms"]["collectives"] == 0
    assert rows["reference"][0]["collective_ops_per_step"] == {}
    # batch=2: each device's whole gradient and three scalars, all-reduced; the trace ran 9 per device per step.
    profile, traffic, _ = rows["2 devices dtensor batch=2"]
    assert traffic["collectives"] == [
        {"kind": "all-reduce", "group": "batch", "group_size": 2, "count": 9, "payload_bytes": (parameters + 3) * 4}
    ]
    assert traffic["link_bytes"] == (parameters + 3) * 4  # 2 (g-1)/g = 1 of it each way
    assert profile["collective_ops_per_step"]["CollectiveReduceV2"] == 9 * 2
    assert profile["parts_ms"]["collectives"] > 0  # implicit in the backward pass, seen by the profiler
    _, traffic, _ = rows["2 devices mirrored update primary"]  # gradients to CPU:0, the updated weights back
    assert traffic["devices"] == [
        {"device": "CPU:0", "sent_bytes": parameters * 4, "received_bytes": (parameters + 2) * 4},
        {"device": "CPU:1", "sent_bytes": (parameters + 2) * 4, "received_bytes": parameters * 4},
    ]
    # The tables: the run's trainers, then every configuration with its bytes and their time at 100 Gb/s.
    text = re.sub(r"\n  (?=\S)", " ", result.stdout)  # the lines under a table, broken at 120 columns, joined
    assert re.search(
        r"^2 devices dtensor batch=2: 9 all-reduce on batch \(3\.45 MB per device\); 3\.45 MB/step on the "
        r"busiest link, >= 0\.290 ms at 100 Gb/s$",
        text,
        re.M,
    )
    assert re.search(
        r"^collectives: dtensor rows ring \(CPUs have no NCCL\); mirrored rows ReductionToOneDevice "
        r"\(CPUs have no NCCL\)$",
        text,
        re.M,
    )
    assert png_size(plots / "step_profile.png") == PNG_SIZE
