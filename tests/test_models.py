"""The model interface: definitions, the ViT against NumPy, checkpoint keys, and broken user models.

No training here (test_vit.py trains the ViT; examples/test_my_model.py a user's model).
"""

import os
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from dtensor_vs_mirrored.dtensor_impl import spec as dtensor_spec
from dtensor_vs_mirrored.shared import cli as compare
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.model import registry as models
from dtensor_vs_mirrored.shared.model import vit
from dtensor_vs_mirrored.shared.model.definition import Model
from dtensor_vs_mirrored.shared.model.mlp import mlp

pytestmark = pytest.mark.fast  # the release matrix runs these on every TensorFlow release

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def numpy_vit(values, images):
    """The ViT written again in NumPy float64, from the layer list alone."""
    v = dict(zip(vit.vit().names, [np.asarray(value, np.float64) for value in values]))

    def norm(x, prefix):
        mean = x.mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-6) * v[prefix + "scale"] + v[
            prefix + "offset"
        ]

    from math import erf

    gelu = np.vectorize(lambda t: 0.5 * t * (1 + erf(t / np.sqrt(2))))
    n = len(images)
    x = images.astype(np.float64).reshape(n, 4, 7, 4, 7).transpose(0, 1, 3, 2, 4).reshape(n, 16, 49)
    x = x @ v["patch/w"] + v["patch/b"] + v["position"]
    for block in range(2):
        p = f"blocks/{block}/"
        h = norm(x, p + "norm1/")
        q, k, val = (
            np.einsum("npd,dhk->nphk", h, v[f"{p}attention/{name}"]) + v[f"{p}attention/{name}_bias"]
            for name in ("query", "key", "value")
        )
        scores = np.einsum("nphk,nqhk->nhpq", q, k) / np.sqrt(8)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        context = np.einsum("nhpq,nqhk->nphk", weights, val)
        x = x + np.einsum("nphk,hkd->npd", context, v[p + "attention/output"]) + v[p + "attention/output_bias"]
        x = x + gelu(norm(x, p + "norm2/") @ v[p + "mlp/w1"] + v[p + "mlp/b1"]) @ v[p + "mlp/w2"] + v[p + "mlp/b2"]
    return norm(x, "norm/").mean(1) @ v["head/w"] + v["head/b"]


def test_vit_shapes_parameters_and_flops():
    definition = vit.vit()
    per_block = 2 * 128 + 3 * (64 * 64 + 64) + 64 * 64 + 64 + 64 * 128 + 128 + 128 * 64 + 64
    assert definition.parameter_count() == 49 * 64 + 64 + 16 * 64 + 2 * per_block + 128 + 64 * 10 + 10 == 71_946
    values = definition.initial_values(22)
    assert values[definition.names.index("blocks/1/attention/query")].shape == (64, 8, 8)
    assert values[definition.names.index("blocks/1/attention/output")].shape == (8, 8, 64)
    forward_multiply_adds = (
        16 * 49 * 64 + 2 * (3 * 16 * 64 * 64 + 2 * 8 * 16 * 16 * 8 + 16 * 64 * 64 + 2 * 16 * 64 * 128) + 64 * 10
    )
    assert definition.flops_per_example == 6 * forward_multiply_adds
    # Distinct draws per variable, reproducible from the seed, widened exactly in float64.
    weights = [value for variable, value in zip(definition.variables, values) if variable.name.endswith("query")]
    assert not np.array_equal(weights[0], weights[1])
    np.testing.assert_array_equal(definition.initial_values(22)[0], values[0])
    assert not np.array_equal(definition.initial_values(23)[0], values[0])
    np.testing.assert_array_equal(definition.initial_values(22, "float64")[0], values[0].astype(np.float64))


def test_vit_forward_matches_numpy(embedded):
    definition = vit.vit()
    values = [
        value + np.float32(0.1) * np.random.default_rng(i).standard_normal(value.shape).astype(np.float32)
        for i, value in enumerate(definition.initial_values(22))
    ]  # biases and norms off their 0 and 1
    images = embedded.x_test[:6]
    float64 = Model(definition, [value.astype(np.float64) for value in values])(images).numpy()
    expected = numpy_vit(values, images)
    # Not 1e-15: TensorFlow's float64 erf (inside GELU) is accurate to ~5e-9 only (measured), the
    # same function in every trainer. Any wrong reshape, head split or norm axis is off by 1e-2 or more.
    np.testing.assert_allclose(float64, expected, rtol=0, atol=1e-7)
    np.testing.assert_allclose(Model(definition, values)(images).numpy(), expected, rtol=0, atol=1e-4)


def test_vit_layouts_split_heads_and_mlp_units_megatron_style():
    definition = vit.vit()
    split = {variable.name: variable.layout for variable in definition.variables if "model" in variable.layout}
    assert split == {
        **{
            f"blocks/{b}/attention/{name}": ("unsharded", "model", "unsharded")
            for b in range(2)
            for name in ("query", "key", "value")
        },
        **{
            f"blocks/{b}/attention/{name}_bias": ("model", "unsharded")
            for b in range(2)
            for name in ("query", "key", "value")
        },
        **{f"blocks/{b}/attention/output": ("model", "unsharded", "unsharded") for b in range(2)},
        **{f"blocks/{b}/mlp/w1": ("unsharded", "model") for b in range(2)},
        **{f"blocks/{b}/mlp/b1": ("model",) for b in range(2)},
        **{f"blocks/{b}/mlp/w2": ("model", "unsharded") for b in range(2)},
    }
    for axis in (1, 2, 4, 8):
        assert definition.split_sizes(axis) == {}
    with pytest.raises(UsageError) as error:
        dtensor_spec.check_config(
            Config(model="vit", devices=6, mesh="batch=2,model=3", batch_size=64), [f"CPU:{i}" for i in range(6)]
        )
    assert str(error.value) == (
        "model vit patches 16x49 width 64 heads 8 mlp 128 blocks 2: variable "
        "blocks/0/attention/query dimension 1 (8) does not divide over the model axis of 3, "
        "and the model allows no padding for it; use a model axis of 1, 2, 4, 8"
    )


def test_checkpoint_keys_follow_the_variable_names(tmp_path):
    model = Model(mlp(), mlp().initial_values(22))
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "mlp"))
    assert sorted(name for name, _ in tf.train.list_variables(path) if name.startswith("model/")) == sorted(
        f"model/layers/{i}/{kind}/.ATTRIBUTES/VARIABLE_VALUE" for i in range(3) for kind in ("w", "b")
    )
    model = Model(vit.vit(), vit.vit().initial_values(22))
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "vit"))
    keys = {name for name, _ in tf.train.list_variables(path)}
    assert {f"model/{name}/.ATTRIBUTES/VARIABLE_VALUE" for name in vit.vit().names} <= keys
    assert [w.shape for w in model.weights] == [v.shape for v in vit.vit().initial_values(22)]


def write_model(tmp_path, body: str) -> str:
    path = tmp_path / "user_model.py"
    path.write_text(
        textwrap.dedent("""
        import tensorflow as tf
        from dtensor_vs_mirrored.shared.model.definition import ModelDefinition, Variable, zeros

        def forward(v, images):
            return tf.matmul(images, v["dense/w"]) + v["dense/b"]
        """)
        + textwrap.dedent(body)
    )
    return f"{path}:model"


BROKEN = {
    "a layout whose rank does not match": (
        """
        def model():
            return ModelDefinition("bad", (Variable("dense/w", (784, 10), zeros, ("model",)),
                                           Variable("dense/b", (10,))), forward, 1)
        """,
        "variable dense/w has a layout of rank 1 ['model'] for its shape of rank 2 [784, 10]; "
        "give one entry per dimension",
    ),
    "a forward that raises": (
        """
        def model():
            return ModelDefinition("bad", (Variable("dense/w", (784, 10)), Variable("dense/bias", (10,))),
                                   forward, 1)
        """,
        "its forward raised KeyError: 'dense/b' (user_model.py:6) on inputs [2, 784] float32",
    ),
    "a width the model axis cannot split, no padding allowed": (
        """
        def model():
            return ModelDefinition("odd", (Variable("dense/w", (784, 10), zeros, ("unsharded", "model")),
                                           Variable("dense/b", (10,))), forward, 1)
        """,
        "model odd: variable dense/w dimension 1 (10) does not divide over the model axis of 4, and the "
        "model allows no padding for it; use a model axis of 1, 2, 5, 10",
    ),
    "logits of the wrong shape": (
        """
        def model():
            return ModelDefinition("bad", (Variable("dense/w", (784, 7)), Variable("dense/b", (7,))), forward, 1)
        """,
        "its forward returned shape [2, 7] for inputs [2, 784] float32; it must return logits [2, 10] "
        "(label_shape [], 10 classes)",
    ),
    "not a definition": (
        """
        def model():
            return 3
        """,
        "returned int; return a Keras model, a (Keras model, LayoutMap) pair or a "
        "dtensor_vs_mirrored.shared.model.ModelDefinition",
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_user_model_is_one_line_and_exit_2(tmp_path, capsys, case):
    body, message = BROKEN[case]
    spec = write_model(tmp_path, body)
    assert compare.main(["--model", spec, "--data", "embedded", "--mesh", "batch=2,model=4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("compare.py: error: ") and err.endswith(message), err


def test_model_spec_errors(tmp_path):
    from dtensor_vs_mirrored.shared.run.model_options import check_model_options

    with pytest.raises(UsageError, match=r"--model 'nope' is unknown; use mlp, vit, gpt or FILE.py:FUNCTION"):
        models.load("nope")
    with pytest.raises(UsageError, match=r"no file /no/such.py"):
        models.load("/no/such.py:model")
    spec = write_model(tmp_path, "")
    with pytest.raises(UsageError, match=r"user_model.py has no function model"):
        models.load(spec)
    with pytest.raises(UsageError, match=r"--hidden sets the MLP's layers; drop it, or use --model mlp \(not vit\)"):
        check_model_options(Config(model="vit", hidden=(64,)))  # where a run starts (compare.py, check_model)


def test_the_example_model_loads_and_is_the_same_definition_each_time():
    spec = os.path.join(ROOT, "examples", "my_model.py") + ":my_model"
    definition = models.load(spec)
    assert definition is models.load(spec)  # one per process: every trainer of a run shares it
    assert definition.split_sizes(3) == {"units": 129}  # padded with a zero unit
