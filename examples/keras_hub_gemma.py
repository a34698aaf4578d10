"""A keras-hub backbone trained with its own layout map: a tiny random `keras_hub.models.GemmaBackbone` (built from a
config: nothing downloads weights or a tokenizer) with Gemma's tied language-model head, laid out by keras-hub's own
`GemmaBackbone.get_layout_map`, which splits the weights on the mesh's `model` and `batch` axes.

    pip install -e ".[hub]"
    python compare.py --model examples/keras_hub_gemma.py:gemma --data embedded --devices 8 --mesh batch=2,model=4 \\
        --dtype float64 --train-examples 256 --test-examples 128 --epochs 1
    python -m pytest -m "" examples/test_keras_hub_gemma.py

It reads 32 character ids of the shipped tiny Shakespeare and gives the next character's logits at every
position; 4 heads, a width of 32 and 128 ids divide over a model axis of 1, 2 or 4 (docs/keras.md, "A keras-hub
backbone", also for `gemma_inputs`: its two named inputs from the .npz that `python keras_hub_gemma.py F.npz` writes).
"""

import gzip
import os

import keras
import keras_hub
import numpy as np

VOCABULARY, CONTEXT = 128, 32
CONFIG = dict(
    vocabulary_size=VOCABULARY,
    num_layers=2,
    num_query_heads=4,
    num_key_value_heads=4,  # the key and value kernels split over the model axis as the query's: heads divide it
    hidden_dim=32,
    intermediate_dim=64,  # Gemma's two gating kernels each take half: 32 units
    head_dim=8,
)


class PaddingMask(keras.layers.Layer):
    """The backbone's `padding_mask` input: every position a token (1), as the windows have no padding. The one
    place the mask is made; a model of two inputs takes it as `keras.Input((CONTEXT,), name="padding_mask")`."""

    def call(self, token_ids):
        return keras.ops.ones_like(token_ids)


def gemma():
    """(a Keras model of token ids [N, 32] -> logits [N, 32, 128], keras-hub's LayoutMap for Gemma)."""
    token_ids = keras.Input((CONTEXT,), dtype="int32", name="token_ids")
    return language_model(token_ids, token_ids, PaddingMask(name="padding_mask")(token_ids))


def gemma_inputs():
    """(a Keras model of {"token_ids", "padding_mask"} [N, 32] -> logits [N, 32, 128], keras-hub's LayoutMap)."""
    inputs = {name: keras.Input((CONTEXT,), dtype="int32", name=name) for name in ("token_ids", "padding_mask")}
    return language_model(inputs, inputs["token_ids"], inputs["padding_mask"])


def language_model(inputs, token_ids, padding_mask):
    """(the backbone and its tied head on `inputs`, keras-hub's LayoutMap for Gemma)."""
    backbone = keras_hub.models.GemmaBackbone(**CONFIG)
    hidden = backbone({"token_ids": token_ids, "padding_mask": padding_mask})
    logits = backbone.token_embedding(hidden, reverse=True)  # the tied head: the embedding's transpose
    # keras-hub's map is for a DeviceMesh; the tool reads only its keys and axis tuples, and lays the variables out
    # on the run's own DTensor mesh (--mesh), so the devices named here are never used.
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], devices=[f"CPU:{i}" for i in range(8)])
    layout_map = keras_hub.models.GemmaBackbone.get_layout_map(mesh)
    return keras.Model(inputs, logits, name="gemma_lm"), layout_map


def write_windows(path: str, train: int = 256, test: int = 128, seed: int = 0) -> None:
    """An .npz for gemma_inputs: windows of the shipped tiny Shakespeare excerpt's character ids (its characters in
    sorted order), each the next character's label a position; after a length of 16 to 32 drawn per window the
    window is padding: id 0, padding_mask 0, label 0."""
    here = os.path.dirname(os.path.abspath(__file__))
    with gzip.open(f"{here}/../shared/training/embedded/tiny_shakespeare_excerpt.txt.gz", "rt") as file:
        text = file.read()
    ids = np.searchsorted(sorted(set(text)), list(text)).astype(np.int32)
    rng = np.random.default_rng(seed)
    starts = rng.choice(len(ids) - CONTEXT - 1, train + test, replace=False)
    windows = np.stack([ids[start : start + CONTEXT + 1] for start in starts])
    mask = (np.arange(CONTEXT) < rng.integers(16, CONTEXT + 1, (train + test, 1))).astype(np.int32)
    x, y = windows[:, :-1] * mask, windows[:, 1:] * mask
    arrays = {}
    for split, part in (("train", slice(0, train)), ("test", slice(train, None))):
        arrays[f"x_{split}_token_ids"], arrays[f"x_{split}_padding_mask"] = x[part], mask[part]
        arrays[f"y_{split}"] = y[part]
    np.savez(path, **arrays)


if __name__ == "__main__":
    import sys

    write_windows(sys.argv[1] if len(sys.argv) > 1 else "windows.npz")
