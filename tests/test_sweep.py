"""The device sweep's plan and marks, without training: which configurations each count gets,
which are skipped and why, and which are marked fastest (compare.py runs them: test_compare.py)."""
import pytest

from shared.config import Config
from shared.errors import UsageError
from shared.sweep import SweepEntry, mark_fastest, plan_sweep


def labels(points):
    return [(p.devices, p.trainer, p.mesh or p.update, p.skipped) for p in points]


def test_every_mesh_and_update_mode_at_each_count(devices):
    points = plan_sweep(Config(), (2, 8), "all", devices)
    assert labels(points) == [
        (2, "dtensor", "batch=2", ""), (2, "dtensor", "batch=1,model=2", ""),
        (2, "mirrored", "primary", ""), (2, "mirrored", "replicas", ""),
        (8, "dtensor", "batch=8", ""), (8, "dtensor", "batch=4,model=2", ""), (8, "dtensor", "batch=2,model=4", ""),
        (8, "dtensor", "batch=1,model=8", ""),  # 700 is padded to 704
        (8, "mirrored", "primary", ""), (8, "mirrored", "replicas", "")]
    dtensor_config = points[5].config
    assert (dtensor_config.devices, dtensor_config.mesh) == (8, "batch=4,model=2")
    assert dtensor_config.trainers == ("dtensor",)  # the reference trains beside it anyway
    assert points[9].config.mirrored_update == "replicas" and points[9].config.trainers == ("mirrored",)
    assert all(p.config.quiet and p.config.checkpoint_dir is None and p.config.export is None for p in points)


def test_batch_meshes_only_is_the_sweep_before_layouts(devices):
    points = plan_sweep(Config(trainers=("reference", "dtensor", "mirrored"), mirrored_update="replicas"),
                        (1, 8), "batch", devices)
    assert labels(points) == [(1, "dtensor", "batch=1", ""), (1, "mirrored", "replicas", ""),
                              (8, "dtensor", "batch=8", ""), (8, "mirrored", "replicas", "")]


def test_a_configuration_that_cannot_run_is_skipped_with_the_trainers_reason(devices):
    points = plan_sweep(Config(batch_size=100, trainers=("dtensor",)), (8,), "all", devices)
    assert labels(points) == [
        (8, "dtensor", "batch=8", "global batch 100 does not divide over the batch axis of 8 (--mesh batch=8); "
                                  "use --batch-size 96 or 104"),
        (8, "dtensor", "batch=4,model=2", ""), (8, "dtensor", "batch=2,model=4", ""),
        (8, "dtensor", "batch=1,model=8", "")]
    dataset = plan_sweep(Config(dtensor_input="dataset", trainers=("dtensor",)), (2,), "batch", devices)
    assert dataset[0].skipped.startswith("--dtensor-input dataset needs a mesh over all 8 logical CPUs")
    with pytest.raises(UsageError, match="^--sweep-meshes 'model' is unknown; use all or batch$"):
        plan_sweep(Config(), (2,), "model", devices)


def entry(devices, trainer, label, ratio, parity_ok=True):
    mesh, update = (label, "") if trainer == "dtensor" else ("", label)
    throughput = None if ratio is None else 1000.0 * ratio
    return SweepEntry(devices, trainer, mesh, update, throughput, 1000.0, ratio, parity_ok)


def test_the_fastest_mesh_and_the_faster_approach_are_marked_by_ratio_at_each_count():
    entries = mark_fastest([
        entry(2, "dtensor", "batch=2", 0.55), entry(2, "dtensor", "batch=1,model=2", 0.76),
        entry(2, "mirrored", "primary", 0.80), entry(2, "mirrored", "replicas", 0.70),
        entry(8, "dtensor", "batch=8", 0.17), entry(8, "dtensor", "batch=1,model=8", 0.95, parity_ok=False),
        entry(8, "dtensor", "batch=2,model=4", None), entry(8, "dtensor", "batch=4,model=2", 0.61),
        entry(8, "mirrored", "primary", 0.45)])
    marked = [(e.devices, e.label, e.fastest_mesh, e.faster_approach) for e in entries
              if e.fastest_mesh or e.faster_approach]
    # A mesh that failed parity or has no figure (below the timing floor) is never the fastest.
    assert marked == [(2, "batch=1,model=2", True, False), (2, "update primary", False, True),
                      (8, "batch=4,model=2", True, True)]
