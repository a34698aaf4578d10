"""Memory per device, read from each trainer's live objects, against the arithmetic of its layout.

No training: the trainers are made as a run makes them, their models and optimizers built (a few seconds).
Hidden 64,32 keeps it small; 64 divides by 8, so each model-sharded device holds exactly 1/8.
"""

import pytest
import tensorflow as tf

from dtensor_vs_mirrored.dtensor_impl.mesh import parse_mesh
from dtensor_vs_mirrored.dtensor_impl.trainer import DTensorTrainer
from dtensor_vs_mirrored.mirrored_impl.trainer import MirroredTrainer
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.measure import memory
from dtensor_vs_mirrored.shared.model.mlp import layer_sizes, parameter_count
from dtensor_vs_mirrored.shared.training import step
from dtensor_vs_mirrored.shared.training.reference import ReferenceTrainer

CONFIG = Config(hidden=(64, 32))
FLOAT = 4
WEIGHTS = FLOAT * parameter_count(layer_sizes(CONFIG.hidden))  # 784-64-32-10: 52,650 parameters
STEP = 8  # Adam's int64 step count, on every device that holds optimizer state
ADAM = 2 * WEIGHTS + STEP  # m and v slots, the step


def dtensor_memory(devices, mesh_text, data, hidden=CONFIG.hidden):
    spec = parse_mesh(mesh_text, len(devices))
    config = CONFIG.replace(hidden=hidden, mesh=mesh_text, quiet=True)
    return step.memory_per_device(DTensorTrainer(config, data, devices[: spec.device_count]))


def test_reference_holds_everything_on_its_device(devices, embedded):
    with tf.device(devices[1]):
        trainer = ReferenceTrainer(CONFIG, embedded, devices[1:2])
    assert step.memory_per_device(trainer) == [memory.DeviceMemory("CPU:1", WEIGHTS, ADAM)]


def test_dtensor_batch_mesh_replicates_everything(devices, embedded):
    assert dtensor_memory(devices, "batch=8", embedded) == [
        memory.DeviceMemory(f"CPU:{i}", WEIGHTS, ADAM) for i in range(8)
    ]


@pytest.mark.parametrize("mesh_text, hidden", [("batch=1,model=8", (64, 32)), ("batch=1,model=8", (60, 32))])
def test_dtensor_model_axis_gives_each_device_an_eighth_of_the_sharded_layers(devices, embedded, mesh_text, hidden):
    """w0 [784, 64/8] and b0 [64/8] column-sharded, w1 [64/8, 32] row-sharded, the rest replicated.
    With hidden 60 the layer is padded to 64 and the padding is held, so the bytes are the same."""
    sharded = 784 * 64 + 64 + 64 * 32
    per_device = FLOAT * (sharded // 8 + 32 + 32 * 10 + 10)
    assert dtensor_memory(devices, mesh_text, embedded, hidden) == [
        memory.DeviceMemory(f"CPU:{i}", per_device, 2 * per_device + STEP) for i in range(8)
    ]
    assert 8 * per_device < 1.1 * WEIGHTS  # against 8 full copies under MirroredStrategy


def mirrored_memory(devices, update, data):
    config = CONFIG.replace(mirrored_update=update, quiet=True)
    return step.memory_per_device(MirroredTrainer(config, data, devices))


def test_mirrored_primary_keeps_8_copies_and_the_optimizer_on_the_first_device(devices, embedded):
    assert mirrored_memory(devices, "primary", embedded) == (
        [memory.DeviceMemory("CPU:0", 2 * WEIGHTS, ADAM)]  # its replica's copy and the plain copy that updates
        + [memory.DeviceMemory(f"CPU:{i}", WEIGHTS, 0) for i in range(1, 8)]
    )


def test_mirrored_replicas_keep_weights_and_slots_on_every_device(devices, embedded):
    assert mirrored_memory(devices, "replicas", embedded) == [
        memory.DeviceMemory(f"CPU:{i}", WEIGHTS, ADAM) for i in range(8)
    ]


def test_largest_total_and_one_line_summary():
    records = [memory.DeviceMemory("CPU:0", 2 * memory.MB, 3 * memory.MB)] + [
        memory.DeviceMemory(f"CPU:{i}", memory.MB, 0) for i in range(1, 8)
    ]
    assert memory.largest_total_bytes(records) == 5 * memory.MB
    assert memory.describe(records) == ("CPU:0 2.00 + 3.00 MB, CPU:1-7 1.00 + 0.00 MB each (weights + optimizer state)")


def test_each_trainers_peak_is_its_own_not_the_largest_its_process_trained_before(devices, embedded):
    """The peak RSS is reset before each trainer (Linux) and the figure is the rise above where the process stood:
    a small model trained after a large one in the same process reports its own small rise, where the process's
    peak so far would have been the large one's; and the header says what the figure is."""
    from dtensor_vs_mirrored.shared.report.header import describe_peak
    from dtensor_vs_mirrored.shared.run.results import train_one
    from dtensor_vs_mirrored.shared.training.data import Dataset

    data = Dataset(embedded.x_train[:256], embedded.y_train[:256], embedded.x_test[:64], embedded.y_test[:64], "e", "")
    large = CONFIG.replace(hidden=(4096, 4096), epochs=1, batch_size=64, quiet=True)  # 19.9M parameters + Adam
    first = train_one("reference", large, data, devices[:1], log=print)
    second = train_one("reference", large.replace(hidden=(16, 8)), data, devices[:1], log=print)
    assert first.peak_memory_rise_mb > 200  # weights, gradients, Adam's slots: 4 x 80 MB, some of it reused
    assert second.peak_memory_rise_mb < 50 < first.peak_memory_rise_mb - 150
    assert describe_peak("CPU") == (
        "memory: peak MB is each trainer's own: how far its process's RSS rose above where it stood when the "
        "trainer started"
    )
