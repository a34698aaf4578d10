"""The device sweep's plan and marks, without training: which configurations each count gets,
which are skipped and why, and which are marked fastest (compare.py runs them: test_compare.py)."""

import pytest

from shared.config import Config
from shared.errors import UsageError
from shared.sweep import (
    SweepEntry,
    best_against_one_device,
    describe_plan,
    mark_fastest,
    plan_sweep,
    rerun_summary,
    sweep_notes,
)


def labels(points):
    return [(p.devices, p.trainer, p.mesh or p.update, p.skipped) for p in points]


def test_every_mesh_and_update_mode_at_each_count(devices):
    points = plan_sweep(Config(sweep_devices=(2, 8)), devices)
    assert labels(points) == [
        (2, "dtensor", "batch=2", ""),
        (2, "dtensor", "batch=1,model=2", ""),
        (2, "mirrored", "primary", ""),
        (2, "mirrored", "replicas", ""),
        (8, "dtensor", "batch=8", ""),
        (8, "dtensor", "batch=4,model=2", ""),
        (8, "dtensor", "batch=2,model=4", ""),
        (8, "dtensor", "batch=1,model=8", ""),  # 700 is padded to 704
        (8, "mirrored", "primary", ""),
        (8, "mirrored", "replicas", ""),
    ]
    dtensor_config = points[5].config
    assert (dtensor_config.devices, dtensor_config.mesh) == (8, "batch=4,model=2")
    assert dtensor_config.trainers == ("dtensor",)  # the reference trains beside it anyway
    assert points[9].config.mirrored_update == "replicas" and points[9].config.trainers == ("mirrored",)
    assert all(p.config.quiet and p.config.checkpoint_dir is None and p.config.export is None for p in points)


def test_batch_meshes_only_is_the_sweep_before_layouts(devices):
    points = plan_sweep(
        Config(
            trainers=("reference", "dtensor", "mirrored"),
            mirrored_update="replicas",
            sweep_devices=(1, 8),
            sweep_meshes="batch",
        ),
        devices,
    )
    assert labels(points) == [
        (1, "dtensor", "batch=1", ""),
        (1, "mirrored", "replicas", ""),
        (8, "dtensor", "batch=8", ""),
        (8, "mirrored", "replicas", ""),
    ]


def test_a_configuration_that_cannot_run_is_skipped_with_the_trainers_reason(devices):
    points = plan_sweep(Config(batch_size=100, trainers=("dtensor",), sweep_devices=(8,)), devices)
    assert labels(points) == [
        (
            8,
            "dtensor",
            "batch=8",
            "global batch 100 does not divide over the batch axis of 8 (--mesh batch=8); use --batch-size 96 or 104",
        ),
        (8, "dtensor", "batch=4,model=2", ""),
        (8, "dtensor", "batch=2,model=4", ""),
        (8, "dtensor", "batch=1,model=8", ""),
    ]
    dataset = plan_sweep(
        Config(dtensor_input="dataset", trainers=("dtensor",), sweep_devices=(2,), sweep_meshes="batch"), devices
    )
    assert dataset[0].skipped.startswith("--dtensor-input dataset needs a mesh over all 8 logical CPUs")
    with pytest.raises(
        UsageError, match=r"^argument --sweep-meshes: invalid choice: 'model' \(choose from 'all', 'batch'\)$"
    ):
        Config(sweep_devices=(2,), sweep_meshes="model")


def entry(devices, trainer, label, ratio, parity_ok=True):
    mesh, update = (label, "") if trainer == "dtensor" else ("", label)
    throughput = None if ratio is None else 1000.0 * ratio
    return SweepEntry(devices, trainer, mesh, update, throughput, 1000.0, ratio, parity_ok)


def test_the_fastest_mesh_and_the_faster_approach_are_marked_by_ratio_at_each_count():
    entries = mark_fastest(
        [
            entry(2, "dtensor", "batch=2", 0.55),
            entry(2, "dtensor", "batch=1,model=2", 0.76),
            entry(2, "mirrored", "primary", 0.80),
            entry(2, "mirrored", "replicas", 0.70),
            entry(8, "dtensor", "batch=8", 0.17),
            entry(8, "dtensor", "batch=1,model=8", 0.95, parity_ok=False),
            entry(8, "dtensor", "batch=2,model=4", None),
            entry(8, "dtensor", "batch=4,model=2", 0.61),
            entry(8, "mirrored", "primary", 0.45),
        ]
    )
    marked = [
        (e.devices, e.label, e.fastest_mesh, e.faster_approach) for e in entries if e.fastest_mesh or e.faster_approach
    ]
    # A mesh that failed parity or has no figure (below the timing floor) is never the fastest.
    assert marked == [
        (2, "batch=1,model=2", True, False),
        (2, "update primary", False, True),
        (8, "batch=4,model=2", True, True),
    ]


def test_one_line_says_when_no_configuration_beat_one_device():
    entries = [
        entry(2, "dtensor", "batch=2", 0.55),
        entry(2, "mirrored", "primary", 0.80),
        entry(8, "dtensor", "batch=1,model=8", 1.30, parity_ok=False),  # failed parity: does not count
        entry(8, "mirrored", "primary", None),
    ]  # below the timing floor: no ratio
    assert best_against_one_device(entries) == (
        "No configuration beat one device on this machine; the best: "
        "mirrored update primary at 2 devices, 0.80x its reference"
    )
    assert best_against_one_device(entries + [entry(8, "mirrored", "replicas", 1.05)]) == ""
    assert best_against_one_device([entry(2, "dtensor", "batch=2", None)]) == ""  # nothing timed: nothing to say


def noted(devices, trainer, label, verdict, reason="", summary="", rerun_seconds=0.0, skipped=""):
    noted_entry = entry(devices, trainer, label, None, parity_ok=verdict in ("ok", "float noise"))
    noted_entry.verdict, noted_entry.reason, noted_entry.summary = verdict, reason, summary
    noted_entry.float64_rerun_seconds, noted_entry.skipped = rerun_seconds, skipped
    return noted_entry


def test_reasons_go_under_the_table_and_reruns_are_summed_per_count():
    entries = [
        noted(
            8,
            "dtensor",
            "batch=8",
            "float noise",
            "float32 left its tolerance at step 58 (loss diff up to 0.0013 "
            "at step 87, rel 0.0072); float64 agrees on all 96 steps (max loss diff 3.3e-16, final weights 2.2e-15)",
            "float32 left its tolerance at step 58; float64 agrees on all 96 steps",
            rerun_seconds=20.5,
        ),
        noted(
            8,
            "dtensor",
            "batch=4,model=2",
            "MISMATCH",
            "at step 0: loss (in float64; ...)",
            "at step 0: loss (in float64)",
            rerun_seconds=21.0,
        ),
        noted(8, "mirrored", "primary", "ok"),
        noted(8, "dtensor", "batch=3", "skipped", "global batch 128 does not divide", skipped="global batch 128 ..."),
        noted(2, "mirrored", "primary", "ok"),
    ]
    assert sweep_notes(entries) == [
        "8 devices dtensor batch=8 (float noise): float32 left its tolerance at step 58; "
        "float64 agrees on all 96 steps",
        "8 devices dtensor batch=4,model=2 (MISMATCH): at step 0: loss (in float64)",
        "8 devices dtensor batch=3 (skipped): global batch 128 does not divide",
    ]
    assert rerun_summary(entries, 8) == (
        "sweep      8 devices: float32 left its tolerance in 2 of 3 configurations; "
        "float64 reruns 41.5 s: 1 float noise, 1 MISMATCH"
    )
    assert rerun_summary(entries, 2) == ""  # no rerun at 2 devices: no line


def test_the_header_says_the_sweep_comes_after_the_run(devices):
    points = plan_sweep(Config(batch_size=100, trainers=("dtensor",), sweep_devices=(2, 8)), devices)
    assert describe_plan(Config(), points) == (
        "sweep: after this run at 8 devices, 6 configurations at 2, 8 devices "
        "(1 skipped), each beside its own reference run"
    )
