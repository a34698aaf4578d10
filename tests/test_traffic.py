"""Bytes per step per device (shared/measure/traffic.py), counted in the functions that ran, against the formula
from the layouts: DTensor's gradient all-reduces on the batch axis (each device's shard of every
variable), its activation all-reduces on the model axis, and MirroredStrategy's reduce to one device
and what comes back from it (a broadcast, or the `primary` update's weights)."""

import dataclasses
import re

import numpy as np
import pytest

from dtensor_vs_mirrored.dtensor_impl import gathering
from dtensor_vs_mirrored.dtensor_impl.layouts import plan_layouts
from dtensor_vs_mirrored.dtensor_impl.traffic import group_axes
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.measure.traffic import Collective, DeviceTraffic, Traffic, copies_traffic, ring_bytes
from dtensor_vs_mirrored.shared.model.registry import definition_for

GLOBAL_BATCH = 128
FLOAT32 = 4
# All-reduced on the batch axis each step besides the gradients: the global batch's real-example count,
# the loss sum and the correct count.
SCALARS = 3


@pytest.fixture(scope="module")
def small(embedded):
    return dataclasses.replace(
        embedded,
        x_train=embedded.x_train[:256],
        y_train=embedded.y_train[:256],
        x_test=embedded.x_test[:128],
        y_test=embedded.y_test[:128],
    )


def gradient_shards(config: Config, model_axis: int) -> int:
    """Elements of every variable's gradient on one device: a variable split on the model axis holds 1/M of
    its (padded) size, any other all of it."""
    definition = definition_for(config)
    sizes = definition.split_sizes(model_axis)
    return sum(
        int(np.prod(definition.shape(variable, sizes))) // (model_axis if variable.split_dim is not None else 1)
        for variable in definition.variables
    )


def activation_all_reduces(model: str, per_device_batch: int):
    """(count, elements of each) of the model axis's all-reduces per step: the MLP's row-parallel layer sums
    its [batch, 500] partial products in the forward pass (its input, the data's layer, needs no gradient);
    each ViT block sums [batch, 16 patches, 64] after its attention output and second MLP weight in the
    forward pass and the gradients of their column-parallel inputs in the backward pass."""
    if model == "mlp":
        return 1, per_device_batch * 500
    return 2 * 4, per_device_batch * 16 * 64


def formula(config: Config, batch: int, model: int):
    """{(kind, axis, group size): (count, bytes each device hands in)} per step, from the layouts."""
    expected = {}
    if batch > 1:
        variables = len(definition_for(config).variables)
        expected[("all-reduce", "batch", batch)] = (
            variables + SCALARS,
            (gradient_shards(config, model) + SCALARS) * FLOAT32,
        )
    if model > 1:
        count, elements = activation_all_reduces(config.model, GLOBAL_BATCH // batch)
        expected[("all-reduce", "model", model)] = (count, count * elements * FLOAT32)
    return expected


def dtensor_traffic(config: Config, small, devices) -> Traffic:
    from dtensor_vs_mirrored.dtensor_impl.spec import count_bytes
    from dtensor_vs_mirrored.dtensor_impl.trainer import DTensorTrainer

    trainer = DTensorTrainer(config, small, devices)
    call = trainer.step_call()
    if config.mesh == "batch=8":  # DTensor lowers a function when it first runs it: before, nothing to count
        traffic, missing = count_bytes(trainer)
        assert traffic is None and re.fullmatch(
            r"found 0 functions that DTensor lowered __inference_train_steps_\d+ "
            r"to, not one",
            missing,
        ), missing
    call.run(call.prepare())
    traffic, missing = count_bytes(trainer)
    assert traffic is not None, missing
    return traffic


@pytest.mark.parametrize(
    "model, batch, model_axis",
    [
        ("mlp", 8, 1),
        ("mlp", 2, 4),
        ("mlp", 1, 8),
        pytest.param("vit", 2, 4, marks=pytest.mark.extended),  # both axes: ~10 s
    ],
)
def test_dtensor_bytes_per_device_match_the_layouts(devices, small, model, batch, model_axis):
    mesh = f"batch={batch}" + (f",model={model_axis}" if model_axis > 1 else "")
    config = Config(trainers=("dtensor",), model=model, mesh=mesh, epochs=1, quiet=True)
    traffic = dtensor_traffic(config, small, devices)
    counted = {(c.kind, c.group, c.group_size): (c.count, c.payload_bytes) for c in traffic.collectives}
    expected = formula(config, batch, model_axis)
    assert counted == expected
    # Each device sends (and receives) 2 (g-1)/g of what it hands to a ring all-reduce.
    per_device = sum(2 * (size - 1) / size * payload for (_, _, size), (_, payload) in expected.items())
    assert [d.device for d in traffic.devices] == devices
    assert all(d.sent_bytes == d.received_bytes == round(per_device) for d in traffic.devices)
    if (model, batch) == ("mlp", 8):  # the tutorial's mesh: every gradient, 905,010 floats, all-reduced
        assert counted == {("all-reduce", "batch", 8): (9, (905_010 + SCALARS) * FLOAT32)}
        assert traffic.link_bytes == round(2 * 7 / 8 * (905_010 + SCALARS) * FLOAT32)


def test_sharded_weights_are_all_gathered_forward_and_their_gradients_reduced_backward(devices, small):
    """--shard-weights with the forward's all-gather (FSDP's; the ViT's, fewer bytes than its expansion): each
    weight split on the batch axis is gathered whole once a step, which DTensor lowers on a data-parallel mesh on
    CPUs to CollectiveGatherV2, an eighth of it from each device (TensorFlow's default: an all-reduce of the
    zero-padded weight; dtensor_impl/gathering.py), and its gradient is all-reduced whole, then sliced; a weight
    that stays whole all-reduces its gradient as on a replicated mesh. Left to DTensor's own expansion, the MLP
    moves activations instead (all-to-all; docs/throughput.md)."""
    from dtensor_vs_mirrored.dtensor_impl.spec import count_bytes
    from dtensor_vs_mirrored.dtensor_impl.trainer import DTensorTrainer

    config = Config(
        trainers=("dtensor",), mesh="batch=8", shard_weights=True, sharded_forward="gather", epochs=1, quiet=True
    )
    trainer = DTensorTrainer(config, small, devices)
    call = trainer.step_call()
    call.run(call.prepare())
    traffic, missing = count_bytes(trainer)
    assert traffic is not None, missing
    definition = definition_for(config)
    plan = plan_layouts(definition, 8, None, shard_weights=True)
    sizes = {v.name: int(np.prod(definition.shape(v, plan.sizes))) for v in definition.variables}
    split = [v.name for v, spec in zip(definition.variables, plan.specs) if "batch" in spec]
    whole = [name for name in sizes if name not in split]
    assert whole == ["layers/2/b"]
    split_bytes = sum(sizes[name] for name in split) * FLOAT32
    gradients = (
        len(split) + len(whole) + SCALARS,
        split_bytes + (sum(sizes[name] for name in whole) + SCALARS) * FLOAT32,
    )
    if trainer.all_gather == gathering.GATHER:  # each device's eighth of every split weight, passed on
        expected = {("all-gather", "batch", 8): (len(split), split_bytes // 8), ("all-reduce", "batch", 8): gradients}
    else:  # the weights, zero-padded and all-reduced, beside their gradients
        expected = {("all-reduce", "batch", 8): (gradients[0] + len(split), gradients[1] + split_bytes)}
    assert {(c.kind, c.group, c.group_size): (c.count, c.payload_bytes) for c in traffic.collectives} == expected
    assert split_bytes == 913_000 * FLOAT32  # the split weights with 704 and 504 units, padded


@pytest.mark.parametrize("update", ["primary", "replicas"])
def test_mirrored_bytes_are_a_reduce_to_one_device_and_what_comes_back(devices, small, update):
    """ReductionToOneDevice: every replica's gradients (and its loss and correct count) go to CPU:0; back come
    the weights the `primary` update made there, or the summed gradients (`replicas`): the same sizes."""
    from dtensor_vs_mirrored.mirrored_impl.spec import count_bytes
    from dtensor_vs_mirrored.mirrored_impl.trainer import MirroredTrainer

    trainer = MirroredTrainer(
        Config(trainers=("mirrored",), mirrored_update=update, epochs=1, quiet=True), small, devices
    )
    trainer.begin(0)
    traffic, missing = count_bytes(trainer)
    assert traffic is not None, missing
    parameters = definition_for(Config()).parameter_count()  # 905,010
    up, down = (parameters + 2) * FLOAT32, parameters * FLOAT32
    assert traffic.collectives == [
        Collective("to one device", "CPU:0", 8, 6 + 2, up),
        Collective("from one device", "CPU:0", 8, 6, down),
    ]
    assert traffic.devices == [DeviceTraffic("CPU:0", 7 * down, 7 * up)] + [
        DeviceTraffic(device, up, down) for device in devices[1:]
    ]
    assert traffic.link_bytes == 7 * up
    assert traffic.floor_ms(100) == pytest.approx(7 * up * 8 / 100e9 * 1e3)
    assert traffic.floor_ms(None) is None


def test_ring_bytes_per_device():
    assert ring_bytes("all-reduce", 800, 8) == 2 * 7 / 8 * 800
    assert ring_bytes("all-reduce", 800, 1) == 0  # a group of one sends nothing
    assert ring_bytes("all-gather", 100, 4) == 300  # passes on the three other pieces
    assert ring_bytes("reduce-scatter", 800, 4) == ring_bytes("all-to-all", 800, 4) == 600


def test_a_groups_axis_is_where_its_devices_differ():
    axes = [("batch", 2), ("model", 4)]  # device b * 4 + m
    assert group_axes(np.array([7, 7, 7, 7, 9, 9, 9, 9]), axes) == "model"
    assert group_axes(np.array([0, 1, 2, 3, 0, 1, 2, 3]), axes) == "batch"
    assert group_axes(np.zeros(8, int), axes) == "batch,model"


def test_copies_without_one_device_in_every_transfer_are_listed_pairwise():
    traffic, _ = copies_traffic(
        [("CPU:0", "CPU:1", 40), ("CPU:2", "CPU:3", 8), ("CPU:2", "CPU:3", 8)], ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]
    )
    assert traffic.collectives == [
        Collective("copy", "CPU:0 -> CPU:1", 2, 1, 40),
        Collective("copy", "CPU:2 -> CPU:3", 2, 2, 16),
    ]
    assert [(d.sent_bytes, d.received_bytes) for d in traffic.devices] == [(40, 0), (0, 40), (16, 0), (0, 16)]
    assert traffic.link_bytes == 40
