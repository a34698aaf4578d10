"""DTensor mesh, layouts and input packing, without training: bad meshes, layouts of weights and slots, padding.

Fast (no training step runs); the parity runs are in test_dtensor.py.
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor

from dtensor_vs_mirrored.dtensor_impl import inputs as dtensor_inputs
from dtensor_vs_mirrored.dtensor_impl import spec as dtensor_spec
from dtensor_vs_mirrored.dtensor_impl import variables as dtensor_variables
from dtensor_vs_mirrored.dtensor_impl.mesh import MeshSpec, create_mesh, every_mesh, mesh_spec, parse_mesh
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.model.mlp import mlp
from dtensor_vs_mirrored.shared.training.registry import fit

U = dtensor.UNSHARDED
MLP = mlp()


def make_mesh(devices, text):
    spec = parse_mesh(text, len(devices))
    return create_mesh(spec, devices[: spec.device_count])


def test_default_mesh_is_pure_data_parallel_over_all_devices():
    assert parse_mesh(None, 8) == MeshSpec(batch=8)
    assert str(mesh_spec("batch=4,model=2", 8, 64)) == "batch=4,model=2"


def test_every_mesh_lists_each_batch_by_model_factorisation():
    assert [str(spec) for spec in every_mesh(8)] == ["batch=8", "batch=4,model=2", "batch=2,model=4", "batch=1,model=8"]
    assert [str(spec) for spec in every_mesh(2)] == ["batch=2", "batch=1,model=2"]
    assert [str(spec) for spec in every_mesh(1)] == ["batch=1"]


@pytest.mark.parametrize(
    "mesh, batch_size, message",
    [
        (
            "batch=4,model=4",
            64,
            "--mesh batch=4,model=4 covers 16 devices but there are 8; the axis sizes must multiply to 8, "
            "e.g. batch=8 or batch=2,model=4",
        ),
        (
            "batch=4",
            64,
            "--mesh batch=4 covers 4 devices but there are 8; the axis sizes must multiply to 8, "
            "e.g. batch=8 or batch=4,model=2",
        ),
        (
            "batch=4,data=2",
            64,
            "--mesh batch=4,data=2: unknown axis 'data'; the axes are batch and model, e.g. batch=8 or batch=4,model=2",
        ),
        (
            "batch=8",
            100,
            "global batch 100 does not divide over the batch axis of 8 (--mesh batch=8); use --batch-size 96 or 104",
        ),
        (None, 4, "global batch 4 does not divide over the batch axis of 8 (--mesh batch=8); use --batch-size 8"),
        (
            "batch8",
            64,
            "--mesh 'batch8': 'batch8' is not AXIS=SIZE with a positive SIZE; use batch=B[,model=M], e.g. batch=8",
        ),
        ("model=8", 64, "--mesh model=8: no batch axis; use batch=1,model=8 for model parallelism only"),
        ("batch=4,batch=2", 64, "--mesh batch=4,batch=2: axis batch is given twice; use batch=B[,model=M]"),
    ],
)
def test_bad_mesh_is_one_line_that_says_what_works(devices, embedded, mesh, batch_size, message):
    with pytest.raises(UsageError) as error:
        fit("dtensor", Config(mesh=mesh, batch_size=batch_size, quiet=True), embedded, devices)
    assert str(error.value) == message
    assert "\n" not in str(error.value)


def test_unknown_input_mode_is_refused_when_the_config_is_made():
    with pytest.raises(
        UsageError,
        match=r"^argument --dtensor-input: invalid choice: 'feed' \(choose from 'pack', "
        r"'dataset'\)$",
    ):
        Config(dtensor_input="feed", quiet=True)


def test_dataset_input_on_part_of_the_devices_is_refused(devices, embedded):
    """DTensorDataset sizes its sharding from all the process's devices; on fewer it repeats batches."""
    with pytest.raises(UsageError) as error:
        config = Config(mesh="batch=2", batch_size=64, dtensor_input="dataset", quiet=True)
        fit("dtensor", config, embedded, devices[:2])
    assert str(error.value) == (
        "--dtensor-input dataset needs a mesh over all 8 logical CPUs of this process, not 2 "
        "(DTensorDataset would repeat batches); use --dtensor-input pack, or --devices 2 in a new process"
    )


def build(devices, mesh_text, optimizer="adam", hidden=(700, 500)):
    mesh = make_mesh(devices, mesh_text)
    definition = mlp(hidden)
    values = definition.initial_values(seed=22)
    model = dtensor_variables.build_model(definition, values, mesh)
    return (
        mesh,
        values,
        model,
        dtensor_variables.build_optimizer(Config(optimizer=optimizer, hidden=hidden), model, mesh),
    )


def specs(variable):
    return list(variable.layout.sharding_specs)


@pytest.mark.parametrize(
    "mesh_text, expected",
    [
        ("batch=8", [([U, U], [U])] * 3),
        ("batch=4,model=2", [([U, "model"], ["model"]), (["model", U], [U]), ([U, U], [U])]),
        ("batch=2,model=4", [([U, "model"], ["model"]), (["model", U], [U]), ([U, U], [U])]),
    ],
)
def test_weights_biases_and_adam_slots_have_the_specified_layouts(devices, mesh_text, expected):
    mesh, _, model, adam = build(devices, mesh_text)
    assert [(specs(layer.w), specs(layer.b)) for layer in model.layers] == expected  # model/layers/<i>/{w,b}
    for weight, m, v in zip(model.weights, adam.m, adam.v):
        assert weight.layout.mesh == mesh
        assert isinstance(m, dtensor.DVariable) and isinstance(v, dtensor.DVariable)
        assert m.layout == weight.layout and v.layout == weight.layout
        assert m.shape == weight.shape
    assert adam.step.layout == dtensor.Layout.replicated(mesh, 0)
    assert adam.step.dtype == tf.int64


def test_deeper_mlp_alternates_column_and_row_sharding_and_keeps_the_output_replicated(devices):
    _, _, model, _ = build(devices, "batch=4,model=2", hidden=(64, 32, 16))
    assert [(specs(layer.w), specs(layer.b)) for layer in model.layers] == [
        ([U, "model"], ["model"]),
        (["model", U], [U]),
        ([U, "model"], ["model"]),
        ([U, U], [U]),
    ]


def test_a_width_the_model_axis_does_not_divide_is_padded_not_refused():
    assert mesh_spec("batch=1,model=8", 8, 64).model == 8  # 700 does not divide by 8
    assert MLP.split_sizes(8) == {"hidden1": 704, "hidden2": 500}  # 500 is row-sharded: whole
    assert mlp((64, 30, 18)).split_sizes(4) == {"hidden1": 64, "hidden2": 30, "hidden3": 20}
    assert MLP.split_sizes(None) == MLP.split_sizes(1) == {"hidden1": 700, "hidden2": 500}


def test_padded_values_add_zero_units_that_unpadded_removes():
    values = MLP.initial_values(seed=22)
    padded = MLP.pad(values, MLP.split_sizes(8))
    assert [v.shape for v in padded] == [(784, 704), (704,), (704, 500), (500,), (500, 10), (10,)]
    np.testing.assert_array_equal(padded[0][:, 700:], 0)  # no input reaches a padded unit
    np.testing.assert_array_equal(padded[1][700:], 0)
    np.testing.assert_array_equal(padded[2][700:, :], 0)  # and it reaches no output
    for restored, value in zip(MLP.unpad(padded), values, strict=True):
        np.testing.assert_array_equal(restored, value)


def test_initial_values_reach_every_layout_unchanged(devices):
    """Copied whole and sliced, not re-drawn under the sharded layout."""
    _, values, model, _ = build(devices, "batch=2,model=4")
    for variable, value in zip(model.weights, values):
        np.testing.assert_array_equal(dtensor_variables.to_numpy(variable), value)
    first_column_shard = dtensor.unpack(model.layers[0].w.read_value())[1].numpy()  # device 1: batch 0, model 1
    np.testing.assert_array_equal(first_column_shard, values[0][:, 700 // 4 : 2 * 700 // 4])


@pytest.mark.parametrize(
    "layout", [("model", "batch"), ("batch", "model"), ("unsharded", "model"), ("model", "unsharded")]
)
def test_every_layout_reads_back_in_order_with_the_gather_lowering_on(devices, monkeypatch, layout):
    """Assembled on the host from the per-device pieces: a relayout to replicated of [model, batch] came back out
    of order with LOWER_DTENSOR_GATHER_TO_COLLECTIVE_GATHER_V2 (dtensor_impl/gathering.py)."""
    monkeypatch.setenv("LOWER_DTENSOR_GATHER_TO_COLLECTIVE_GATHER_V2", "1")
    mesh = create_mesh(MeshSpec(batch=2, model=4), devices)
    value = np.arange(16 * 8, dtype=np.float32).reshape(16, 8)
    variable = dtensor.DVariable(dtensor_variables.on_mesh(value, dtensor.Layout(list(layout), mesh)))
    np.testing.assert_array_equal(dtensor_variables.to_numpy(variable), value)


def test_partial_batch_is_padded_with_zero_weight_examples():
    x = np.arange(45 * 3, dtype=np.float32).reshape(45, 3) + 1
    y = np.arange(45) % 10
    x_padded, y_padded, weights = dtensor_inputs.pad_batch(x, y, batch_shards=8)
    assert x_padded.shape == (48, 3) and y_padded.shape == (48,)
    np.testing.assert_array_equal(x_padded[:45], x)
    np.testing.assert_array_equal(y_padded[:45], y)
    np.testing.assert_array_equal(weights, [1.0] * 45 + [0.0] * 3)
    _, _, unpadded_weights = dtensor_inputs.pad_batch(x[:40], y[:40], batch_shards=8)
    assert unpadded_weights.shape == (40,) and unpadded_weights.min() == 1.0
    # An epoch's short last batch, padded to the full batch's shape (and then to divide): the full batches' trace.
    x_full, _, full_weights = dtensor_inputs.pad_batch(x, y, batch_shards=8, at_least=64)
    assert x_full.shape == (64, 3) and full_weights.tolist() == [1.0] * 45 + [0.0] * 19
    assert dtensor_inputs.pad_batch(x, y, batch_shards=8, at_least=50)[0].shape == (56, 3)


def test_pack_batch_gives_each_device_its_batch_shard(devices):
    mesh = make_mesh(devices, "batch=4,model=2")
    x = np.arange(45 * 2, dtype=np.float32).reshape(45, 2)
    y = np.arange(45, dtype=np.int64)
    x_batch, y_batch, weights = dtensor_inputs.pack_batch(x, y, mesh)
    assert x_batch.shape == (48, 2)
    assert dtensor.fetch_layout(x_batch) == dtensor.Layout(["batch", U], mesh)
    components = [c.numpy() for c in dtensor.unpack(y_batch)]
    for device, component in enumerate(components):  # devices 2b and 2b+1 hold batch shard b
        np.testing.assert_array_equal(component, np.pad(y, (0, 3))[12 * (device // 2) : 12 * (device // 2 + 1)])
    assert float(tf.reduce_sum(weights)) == 45.0


def test_float64_on_a_multi_device_mesh_needs_a_release_whose_collectives_have_float64(monkeypatch):
    """Measured by the release matrix: 2.12's DTensor all-reduce and 2.13's all-gather reject float64; on 2.13 only
    weights split on the batch axis all-gather (a model axis no longer does: per-device readback)."""
    config = Config(dtype="float64", mesh="batch=2")
    devices = [f"CPU:{i}" for i in range(4)]
    monkeypatch.setattr(dtensor_spec, "tensorflow_release", lambda: (2, 14))
    assert dtensor_spec.check_config(config, devices[:2])
    assert dtensor_spec.check_config(config.replace(mesh="batch=2,model=2"), devices)
    monkeypatch.setattr(dtensor_spec, "tensorflow_release", lambda: (2, 12))
    with pytest.raises(UsageError, match="--dtype float64 on DTensor mesh batch=2 needs TensorFlow 2.13"):
        dtensor_spec.check_config(config, devices[:2])
    dtensor_spec.check_config(config.replace(mesh="batch=1"), devices[:1])  # one device: no collective
    dtensor_spec.check_config(config.replace(dtype="float32"), devices[:2])
    monkeypatch.setattr(dtensor_spec, "tensorflow_release", lambda: (2, 13))
    dtensor_spec.check_config(config, devices[:2])
    dtensor_spec.check_config(config.replace(mesh="batch=2,model=2"), devices)
    with pytest.raises(UsageError, match="mesh batch=2,model=2 needs TensorFlow 2.14"):
        dtensor_spec.check_config(config.replace(mesh="batch=2,model=2", shard_weights=True), devices)
