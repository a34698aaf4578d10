"""Memory per device, read from each trainer's live objects, against the arithmetic of its layout.

No training: the models and optimizers are built as the trainers build them (a few seconds).
Hidden 64,32 keeps it small; 64 divides by 8, so each model-sharded device holds exactly 1/8.
"""

import pytest
import tensorflow as tf

from dtensor_impl import trainer as dtensor_trainer
from dtensor_impl.mesh import create_mesh, parse_mesh
from mirrored_impl import trainer as mirrored_trainer
from shared.config import Config
from shared.measure import memory
from shared.model.mlp import layer_sizes, mlp, parameter_count
from shared.training import reference
from shared.training.build import build_model_and_optimizer

CONFIG = Config(hidden=(64, 32))
FLOAT = 4
WEIGHTS = FLOAT * parameter_count(layer_sizes(CONFIG.hidden))  # 784-64-32-10: 52,650 parameters
STEP = 8  # Adam's int64 step count, on every device that holds optimizer state
ADAM = 2 * WEIGHTS + STEP  # m and v slots, the step


def dtensor_memory(devices, mesh_text, hidden=CONFIG.hidden):
    spec = parse_mesh(mesh_text, len(devices))
    mesh = create_mesh(spec, devices[: spec.device_count])
    definition = mlp(hidden)
    values = definition.pad(definition.initial_values(22), definition.split_sizes(spec.model))
    model = dtensor_trainer.build_model(definition, values, mesh)
    optimizer = dtensor_trainer.build_optimizer(CONFIG.replace(hidden=hidden), model, mesh)
    return dtensor_trainer.memory_per_device(model, optimizer)


def test_reference_holds_everything_on_its_device(devices):
    with tf.device(devices[1]):
        model, optimizer = build_model_and_optimizer(CONFIG)
    assert reference.memory_per_device(model, optimizer) == [memory.DeviceMemory("CPU:1", WEIGHTS, ADAM)]


def test_dtensor_batch_mesh_replicates_everything(devices):
    assert dtensor_memory(devices, "batch=8") == [memory.DeviceMemory(f"CPU:{i}", WEIGHTS, ADAM) for i in range(8)]


@pytest.mark.parametrize("mesh_text, hidden", [("batch=1,model=8", (64, 32)), ("batch=1,model=8", (60, 32))])
def test_dtensor_model_axis_gives_each_device_an_eighth_of_the_sharded_layers(devices, mesh_text, hidden):
    """w0 [784, 64/8] and b0 [64/8] column-sharded, w1 [64/8, 32] row-sharded, the rest replicated.
    With hidden 60 the layer is padded to 64 and the padding is held, so the bytes are the same."""
    sharded = 784 * 64 + 64 + 64 * 32
    per_device = FLOAT * (sharded // 8 + 32 + 32 * 10 + 10)
    assert dtensor_memory(devices, mesh_text, hidden) == [
        memory.DeviceMemory(f"CPU:{i}", per_device, 2 * per_device + STEP) for i in range(8)
    ]
    assert 8 * per_device < 1.1 * WEIGHTS  # against 8 full copies under MirroredStrategy


def mirrored_memory(devices, update):
    strategy = tf.distribute.MirroredStrategy(
        devices=[f"/device:{d}" for d in devices], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    model, optimizer, primary_model = mirrored_trainer.build_models(strategy, CONFIG, update)
    return mirrored_trainer.memory_per_device(strategy, model, optimizer, primary_model)


def test_mirrored_primary_keeps_8_copies_and_the_optimizer_on_the_first_device(devices):
    assert mirrored_memory(devices, "primary") == (
        [memory.DeviceMemory("CPU:0", 2 * WEIGHTS, ADAM)]  # its replica's copy and the plain copy that updates
        + [memory.DeviceMemory(f"CPU:{i}", WEIGHTS, 0) for i in range(1, 8)]
    )


def test_mirrored_replicas_keep_weights_and_slots_on_every_device(devices):
    assert mirrored_memory(devices, "replicas") == [memory.DeviceMemory(f"CPU:{i}", WEIGHTS, ADAM) for i in range(8)]


def test_largest_total_and_one_line_summary():
    records = [memory.DeviceMemory("CPU:0", 2 * memory.MB, 3 * memory.MB)] + [
        memory.DeviceMemory(f"CPU:{i}", memory.MB, 0) for i in range(1, 8)
    ]
    assert memory.largest_total_bytes(records) == 5 * memory.MB
    assert memory.describe(records) == ("CPU:0 2.00 + 3.00 MB, CPU:1-7 1.00 + 0.00 MB each (weights + optimizer state)")
