"""An example test of a keras-hub backbone trained with its own layout map (examples/keras_hub_gemma.py), through
check_model, float64: keras-hub's GemmaBackbone.get_layout_map splits its weights on the model and batch axes of
every mesh of 8, and every trainer computes one device's steps within 1e-8.

    pip install -e ".[hub]"
    python -m pytest -m "" examples/test_keras_hub_gemma.py
"""

import os

import pytest

from dtensor_vs_mirrored.shared.api import check_model
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.report.layouts import layouts_dict

HERE = os.path.dirname(os.path.abspath(__file__))
GEMMA = f"{HERE}/keras_hub_gemma.py:gemma"
MESHES = ("batch=2,model=4", "batch=4,model=2", "batch=8")
RUN = dict(devices=8, dtype="float64", epochs=1, batch_size=128, train_examples=256, test_examples=128)


@pytest.fixture
def keras_hub():
    """Each test skips, not the module, so that the suite collects the same tests with keras-hub or without it."""
    return pytest.importorskip("keras_hub", reason='keras-hub is not installed: pip install -e ".[hub]"')


# extended: 4 trainers of a 2-block Gemma, ~90 s on 2 cores (and keras-hub is no test dependency).
@pytest.mark.extended
def test_gemma_trains_one_devices_steps_on_its_own_layout_map_on_every_mesh_of_8_and_mirrored(keras_hub):
    result = check_model(GEMMA, meshes=MESHES, **RUN)
    assert result.ok, result.summary()
    assert set(result.verdicts) == {*(f"dtensor {mesh}" for mesh in MESHES), "mirrored"}
    assert all(verdict.verdict == "ok" for verdict in result.verdicts.values()), result.summary()
    for name, parity in result.parity.items():
        diffs = (parity.max_abs_loss_diff, parity.max_abs_grad_diff, parity.max_abs_weight_diff)
        assert max(diffs) <= 1e-8, (name, diffs)


def test_gemmas_layout_map_keys_each_lay_out_its_variables(keras_hub):
    layouts = layouts_dict(Config(model=GEMMA, devices=8, mesh="batch=2,model=4"))
    assert [(key["key"], len(key["variables"])) for key in layouts["keys"]] == [
        ("token_embedding/embeddings", 1),
        ("decoder_block.*attention.*(query|key|value).kernel", 6),
        ("decoder_block.*attention_output.kernel", 2),
        ("decoder_block.*ffw_gating.kernel", 2),
        ("decoder_block.*ffw_gating_2.kernel", 2),
        ("decoder_block.*ffw_linear.kernel", 2),
    ]
    query = layouts["keys"][1]["variables"][0]
    assert query == {"path": "decoder_block_0/attention/query/kernel", "layout": ["model", "batch", "unsharded"]}
    assert (layouts["unmatched_keys"], layouts["replicated"], layouts["other_rule_differences"]) == ([], [], [])
    # 18,592 float32 parameters: 18,432 split over all 8 devices, the 5 norm scales' 160 whole: (2,304 + 160) x 4 bytes
    assert (layouts["weight_bytes"], layouts["weight_bytes_per_device"]) == (74_368, 9_856)


# extended: the reference, DTensor on one mesh and MirroredStrategy of a 2-block Gemma, ~45 s on 2 cores.
@pytest.mark.extended
def test_gemma_trains_on_its_two_named_inputs_from_an_npz_with_padding(keras_hub, tmp_path):
    from keras_hub_gemma import write_windows  # beside this test: pytest puts its folder on the path

    write_windows(str(tmp_path / "windows.npz"), train=RUN["train_examples"], test=RUN["test_examples"])
    gemma_inputs = f"{HERE}/keras_hub_gemma.py:gemma_inputs"
    result = check_model(gemma_inputs, meshes=("batch=2,model=4",), data=str(tmp_path / "windows.npz"), **RUN)
    assert result.ok, result.summary()
    assert set(result.verdicts) == {"dtensor batch=2,model=4", "mirrored"}
    for name, parity in result.parity.items():
        diffs = (parity.max_abs_loss_diff, parity.max_abs_grad_diff, parity.max_abs_weight_diff)
        assert max(diffs) <= 1e-8, (name, diffs)
