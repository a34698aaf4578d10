"""A keras-hub backbone trained with its own layout map: a tiny random `keras_hub.models.GemmaBackbone` (built from a
config: nothing downloads weights or a tokenizer) with Gemma's tied language-model head, laid out by keras-hub's own
`GemmaBackbone.get_layout_map`, which splits the weights on the mesh's `model` and `batch` axes.

    pip install -e ".[hub]"
    python compare.py --model examples/keras_hub_gemma.py:gemma --data embedded --devices 8 --mesh batch=2,model=4 \\
        --dtype float64 --train-examples 256 --test-examples 128 --epochs 1
    python -m pytest -m "" examples/test_keras_hub_gemma.py

It reads 32 character ids of the shipped tiny Shakespeare (65 of its 128 ids) and gives the next character's
logits at every position. 4 heads, a width of 32 and 128 ids divide over a model axis of 1, 2 or 4 and a batch
axis of up to 8 (docs/keras.md, "A keras-hub backbone").
"""

import keras
import keras_hub

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
    backbone = keras_hub.models.GemmaBackbone(**CONFIG)
    token_ids = keras.Input((CONTEXT,), dtype="int32", name="token_ids")
    padding_mask = PaddingMask(name="padding_mask")(token_ids)
    hidden = backbone({"token_ids": token_ids, "padding_mask": padding_mask})
    logits = backbone.token_embedding(hidden, reverse=True)  # the tied head: the embedding's transpose
    # keras-hub's map is for a DeviceMesh; the tool reads only its keys and axis tuples, and lays the variables out
    # on the run's own DTensor mesh (--mesh), so the devices named here are never used.
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], devices=[f"CPU:{i}" for i in range(8)])
    layout_map = keras_hub.models.GemmaBackbone.get_layout_map(mesh)
    return keras.Model(token_ids, logits, name="gemma_lm"), layout_map
