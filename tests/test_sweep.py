"""The device sweep's plan and marks, without training: which configurations each count gets,
which are skipped and why, and which are marked fastest (compare.py runs them: test_compare.py)."""

import pytest

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.judge.ranking import SweepEntry, mark_fastest
from dtensor_vs_mirrored.shared.measure.traffic import DeviceTraffic, Traffic
from dtensor_vs_mirrored.shared.report.sweep import (
    best_against_one_device,
    conclusion_lines,
    describe_plan,
    format_entry_line,
    rerun_summary,
    sweep_notes,
    sweep_rows,
)
from dtensor_vs_mirrored.shared.run.sweep import plan_sweep


def labels(points):
    return [(p.devices, p.trainer, p.label.replace("update ", ""), p.skipped) for p in points]


def test_every_mesh_and_update_mode_at_each_count(devices):
    points = plan_sweep(Config(sweep_devices=(2, 8)), devices)
    assert labels(points) == [
        (2, "dtensor", "batch=2", ""),
        (2, "dtensor", "batch=2 sharded", ""),  # every mesh with a batch axis > 1, again with --shard-weights
        (2, "dtensor", "batch=1,model=2", ""),
        (2, "mirrored", "primary", ""),
        (2, "mirrored", "replicas", ""),
        (8, "dtensor", "batch=8", ""),
        (8, "dtensor", "batch=8 sharded", ""),
        (8, "dtensor", "batch=4,model=2", ""),
        (8, "dtensor", "batch=4,model=2 sharded", ""),
        (8, "dtensor", "batch=2,model=4", ""),
        (8, "dtensor", "batch=2,model=4 sharded", ""),
        (8, "dtensor", "batch=1,model=8", ""),  # 700 is padded to 704
        (8, "mirrored", "primary", ""),
        (8, "mirrored", "replicas", ""),
    ]
    dtensor_config, sharded = points[7].config, points[8].config
    assert (dtensor_config.devices, dtensor_config.mesh, dtensor_config.shard_weights) == (8, "batch=4,model=2", False)
    assert (sharded.mesh, sharded.shard_weights, points[8].shard_weights) == ("batch=4,model=2", True, True)
    assert dtensor_config.trainers == ("dtensor",)  # the reference trains beside it anyway
    assert points[13].config.mirrored_update == "replicas" and points[13].config.trainers == ("mirrored",)
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
        (
            8,
            "dtensor",
            "batch=8 sharded",
            "global batch 100 does not divide over the batch axis of 8 (--mesh batch=8); use --batch-size 96 or 104",
        ),
        (8, "dtensor", "batch=4,model=2", ""),
        (8, "dtensor", "batch=4,model=2 sharded", ""),
        (8, "dtensor", "batch=2,model=4", ""),
        (8, "dtensor", "batch=2,model=4 sharded", ""),
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


def entry(devices, trainer, label, ratio, parity_ok=True, steps=64, memory_mb=10.0, link_mb=None):
    """A made-up configuration's figures: `steps` measured, `memory_mb` per device, `link_mb` per step (None:
    not counted)."""
    mesh, update = (label, "") if trainer == "dtensor" else ("", label)
    throughput = None if ratio is None else 1000.0 * ratio
    found = SweepEntry(
        devices=devices,
        trainer=trainer,
        mesh=mesh.replace(" sharded", ""),
        update=update,
        throughput_examples_per_s=throughput,
        reference_examples_per_s=1000.0,
        ratio_to_reference=ratio,
        parity_ok=parity_ok,
    )
    found.shard_weights, found.measured_steps = mesh.endswith(" sharded"), steps if ratio is not None else 0
    found.memory_per_device_bytes = int(memory_mb * 2**20)
    if link_mb is not None:
        found.traffic = Traffic("made up", [], [DeviceTraffic("CPU:0", int(link_mb * 2**20), 0)])
    return found


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
        "sweep: after this run at 8 devices, 10 configurations at 2, 8 devices "
        "(2 skipped), each judged against this run's reference, timed beside it"
    )


def test_a_ratio_from_too_few_measured_steps_is_shown_and_not_ranked():
    """One measured epoch of 4 steps once gave a 1.25x "faster approach": such a ratio gets a ? and no mark."""
    entries = mark_fastest(
        [
            entry(8, "dtensor", "batch=8", 0.30),
            entry(8, "dtensor", "batch=1,model=8", 1.25, steps=4),
            entry(8, "mirrored", "primary", 0.45),
        ]
    )
    assert [(e.label, e.too_short, e.fastest_mesh, e.faster_approach) for e in entries] == [
        ("batch=8", False, True, False),
        ("batch=1,model=8", True, False, False),
        ("update primary", False, False, True),
    ]
    assert [row[3] for row in sweep_rows(entries)] == ["0.30x", "1.25x?", "0.45x"]
    assert conclusion_lines(entries, "MLP")[-1] == (
        "8 devices: 1 ratio marked ? came from 4 measured steps, too few to rank; ask for 30 or more (more "
        "--epochs or --train-examples)"
    )


def test_the_conclusion_names_the_fastest_the_smallest_the_quietest_and_what_fits_for_the_runs_model():
    entries = mark_fastest(
        [
            entry(8, "dtensor", "batch=8", 0.20, memory_mb=10.36, link_mb=6.04),
            entry(8, "dtensor", "batch=8 sharded", 0.28, memory_mb=1.31, link_mb=6.59),
            entry(8, "dtensor", "batch=1,model=8", 0.70, memory_mb=1.36, link_mb=0.43),
            entry(8, "dtensor", "batch=2,model=4", 0.90, parity_ok=False, memory_mb=0.5, link_mb=0.1),
            entry(8, "mirrored", "primary", 0.45, memory_mb=13.81, link_mb=24.17),
        ]
    )
    assert conclusion_lines(entries, "ViT", device_memory_mb=2) == [
        "ViT at 8 devices: fastest dtensor batch=1,model=8 (0.70x); least memory dtensor batch=8 sharded (1.31 "
        "MB/device); fewest bytes dtensor batch=1,model=8 (0.43 MB/step); within 2 MB/device: dtensor batch=8 "
        "sharded, dtensor batch=1,model=8"
    ]  # batch=2,model=4 failed parity: never named


def test_a_progress_line_keeps_the_longest_label_apart_from_its_figure():
    line = format_entry_line(entry(8, "dtensor", "batch=4,model=2 sharded", 0.74))
    assert "dtensor  batch=4,model=2 sharded 740 examples/s (0.74x), reference 1,000; parity" in line


def spread_entry(devices, trainer, label, ratio, low, high):
    found = entry(devices, trainer, label, ratio)
    found.ratio_spread = [low, high]
    return found


def test_a_ratio_is_marked_tied_only_where_its_spread_overlaps_another_at_its_count():
    """The spread: the min-max of its rounds' ratios, each beside the reference's (shared/run/timing.py)."""
    entries = mark_fastest(
        [
            spread_entry(8, "dtensor", "batch=8", 0.20, 0.18, 0.22),
            spread_entry(8, "dtensor", "batch=1,model=8", 0.55, 0.50, 0.61),
            spread_entry(8, "mirrored", "primary", 0.60, 0.58, 0.66),  # overlaps batch=1,model=8
            spread_entry(8, "mirrored", "replicas", 0.30, 0.27, 0.33),
            spread_entry(2, "mirrored", "primary", 0.21, 0.19, 0.23),  # another count: no rival of batch=8
        ]
    )
    assert [(e.label, e.tied) for e in entries if e.devices == 8] == [
        ("batch=8", False),
        ("batch=1,model=8", True),
        ("update primary", True),
        ("update replicas", False),
    ]
    assert [row[3] for row in sweep_rows(entries)] == [
        "0.20x (0.18-0.22)",
        "0.55x (0.50-0.61)?",
        "0.60x (0.58-0.66)?",
        "0.30x (0.27-0.33)",
        "0.21x (0.19-0.23)",
    ]
    assert conclusion_lines(entries, "MLP")[:2] == [
        "MLP at 8 devices: fastest mirrored update primary (0.60x, 0.58-0.66, within the spread of dtensor "
        "batch=1,model=8); least memory dtensor batch=8 (10.00 MB/device)",
        "8 devices: 2 ratios marked ? have spreads (the min-max of their rounds, each beside the reference's) that "
        "overlap another's: their order was not measured",
    ]
    assert "(0.55x, 0.50-0.61), reference 1,000" in format_entry_line(entries[1])


def test_a_configuration_the_main_run_or_the_lanes_trained_is_taken_and_the_reference_trains_once(devices):
    from types import SimpleNamespace

    from dtensor_vs_mirrored.shared.measure.history import History
    from dtensor_vs_mirrored.shared.run.results import TrainerResult
    from dtensor_vs_mirrored.shared.run.sweep import reference_once, trained_by_main_run
    from dtensor_vs_mirrored.shared.training.protocol import RunControl

    def trained(name, **details):
        return TrainerResult(name, History(name, "", details=details))

    main = SimpleNamespace(
        config=Config(devices=8),
        results={"dtensor": trained("dtensor", mesh="batch=8"), "mirrored": trained("mirrored", update="primary")},
        float64_histories={},
    )
    points = {p.label: p for p in plan_sweep(Config(sweep_devices=(2, 8)), devices) if p.devices == 8}
    assert [label for label, point in points.items() if trained_by_main_run(point, main)] == [
        "batch=8",
        "update primary",
    ]  # not batch=8 sharded, not at 2 devices
    calls, float64 = [], Config(dtype="float64")
    reruns = {("mirrored", float64): "the lanes' rerun"}  # Blocks.rerun trained it with the block
    train = reference_once(
        lambda entry, config, control=None: calls.append(entry.trainer) or entry.trainer, main, {}, reruns
    )
    reference, dtensor, mirrored = (
        SimpleNamespace(trainer=name, key=name) for name in ("reference", "dtensor", "mirrored")
    )
    results = [train(reference, float64), train(reference, float64), train(dtensor, float64), train(mirrored, float64)]
    train(reference, float64, RunControl(replay_step=3))  # a replay is its own run
    assert results == ["reference", "reference", "dtensor", "the lanes' rerun"] and reruns == {}
    assert calls == ["reference", "dtensor", "reference"]


def test_the_tables_title_says_how_its_speeds_were_taken():
    from dtensor_vs_mirrored.shared.report.tables import sweep_title

    assert sweep_title(Config(sweep_devices=(2,))).endswith("judged against this run's reference and timed beside it")
    untimed = "judged against this run's reference and its speeds from its epochs (not timed: --no-timing or float64)"
    assert sweep_title(Config(sweep_devices=(2,), timing=False)).endswith(untimed)
    assert sweep_title(Config(sweep_devices=(2,), dtype="float64")).endswith(untimed)
