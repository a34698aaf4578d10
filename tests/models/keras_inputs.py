"""Keras models of several named inputs (tests/test_keras_inputs.py): token ids and a 0/1 padding mask as a
keras-hub backbone takes them, two float inputs of other shapes, and their mistakes."""

import keras
import numpy as np

VOCABULARY = 50
LENGTH = 8
CLASSES = 4


def masked_tokens(layout_map=None):
    """{"token_ids", "padding_mask"} -> an Embedding averaged over the unmasked positions -> Dense -> logits."""
    token_ids = keras.Input((LENGTH,), dtype="int32", name="token_ids")
    padding_mask = keras.Input((LENGTH,), dtype="int32", name="padding_mask")
    embedded = keras.layers.Embedding(VOCABULARY, 16, name="embed")(token_ids)
    mask = keras.ops.expand_dims(keras.ops.cast(padding_mask, embedded.dtype), -1)
    pooled = keras.ops.sum(embedded * mask, axis=1) / keras.ops.maximum(keras.ops.sum(mask, axis=1), 1.0)
    hidden = keras.layers.Dense(32, activation="relu", name="hidden")(pooled)
    model = keras.Model(
        {"token_ids": token_ids, "padding_mask": padding_mask}, keras.layers.Dense(CLASSES, name="out")(hidden)
    )
    return model if layout_map is None else (model, layout_map)


def segments_inside(named=True):
    """A BERT's shape: a backbone embeds the token ids (50) and segment ids (2) it is given; the head's model makes
    the segment ids from the token ids, zeros_like, so its token ids reach an Embedding of 2 through one op."""
    ids, segments = (keras.Input((LENGTH,), dtype="int32", name=name) for name in ("ids", "segments"))
    summed = keras.layers.Add()(
        [
            keras.layers.Embedding(VOCABULARY, 8, name="token")(ids),
            keras.layers.Embedding(2, 8, name="segment")(segments),
        ]
    )
    backbone = keras.Model({"ids": ids, "segments": segments}, keras.ops.mean(summed, axis=1), name="backbone")
    token_ids = keras.Input((LENGTH,), dtype="int32", name="token_ids")
    inputs = {"token_ids": token_ids, "padding_mask": keras.Input((LENGTH,), dtype="int32", name="padding_mask")}
    pooled = backbone({"ids": token_ids, "segments": keras.ops.zeros_like(token_ids)})
    return keras.Model(inputs if named else token_ids, keras.layers.Dense(CLASSES, name="out")(pooled))


def segments_inside_one_input():
    """segments_inside taking the token ids alone."""
    return segments_inside(named=False)


def masked_tokens_split():
    """masked_tokens with its hidden layer split on the model axis by a LayoutMap."""
    layout_map = keras.distribution.LayoutMap(None)
    layout_map["hidden/kernel"] = (None, "model")
    layout_map["hidden/bias"] = ("model",)
    layout_map["out/kernel"] = ("model", None)
    return masked_tokens(layout_map)


def two_floats():
    """A list of two float inputs of other shapes: an image [6, 6, 1] and a feature vector [5]."""
    image = keras.Input((6, 6, 1), name="image")
    features = keras.Input((5,), name="features")
    convolved = keras.layers.Flatten()(keras.layers.Conv2D(4, 3, name="conv")(image))
    joined = keras.layers.Concatenate()([convolved, keras.layers.Dense(8, name="feature_dense")(features)])
    return keras.Model([image, features], keras.layers.Dense(CLASSES, name="out")(joined))


def two_floats_dropout():
    """two_floats with Keras's own Dropout before its output: DTensor and MirroredStrategy each draw other units, so
    both differ from one device and the replay names the first layer that does, from each trainer's taps."""
    image = keras.Input((6, 6, 1), name="image")
    features = keras.Input((5,), name="features")
    convolved = keras.layers.Flatten()(keras.layers.Conv2D(4, 3, name="conv")(image))
    joined = keras.layers.Concatenate()([convolved, keras.layers.Dense(8, name="feature_dense")(features)])
    dropped = keras.layers.Dropout(0.5, name="drop")(joined)
    return keras.Model([image, features], keras.layers.Dense(CLASSES, name="out")(dropped))


def write_tokens(path, train=290, test=96, seed=0, **replaced):
    """An .npz for masked_tokens: token ids, a 0/1 padding mask of 1 to LENGTH leading positions and a class each
    computed from the unmasked ids; `replaced` arrays (by key) in place of those made, None leaving one out."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, count in (("train", train), ("test", test)):
        ids = rng.integers(0, VOCABULARY, (count, LENGTH)).astype(np.int32)
        mask = (np.arange(LENGTH) < rng.integers(1, LENGTH + 1, (count, 1))).astype(np.int32)
        arrays[f"x_{split}_token_ids"], arrays[f"x_{split}_padding_mask"] = ids, mask
        arrays[f"y_{split}"] = (np.where(mask == 1, ids, 0).sum(1) // 7 % CLASSES).astype(np.int64)
    arrays.update(replaced)
    np.savez(path, **{key: value for key, value in arrays.items() if value is not None})
    return str(path)


def write_floats(path, train=290, test=96, seed=0):
    """An .npz for two_floats and two_floats_dropout: random images, features and classes."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, count in (("train", train), ("test", test)):
        arrays[f"x_{split}_image"] = rng.normal(size=(count, 6, 6, 1)).astype(np.float32)
        arrays[f"x_{split}_features"] = rng.normal(size=(count, 5)).astype(np.float32)
        arrays[f"y_{split}"] = rng.integers(0, CLASSES, count)
    np.savez(path, **arrays)
    return str(path)


def backbone_with_head():
    """A keras-hub-style backbone of {"token_ids", "padding_mask"} called as a layer under a classification head, on
    Inputs named as the backbone's."""

    def inputs():
        return {
            "token_ids": keras.Input((LENGTH,), dtype="int32", name="token_ids"),
            "padding_mask": keras.Input((LENGTH,), dtype="int32", name="padding_mask"),
        }

    inner = inputs()
    embedded = keras.layers.Embedding(VOCABULARY, 16, name="embed")(inner["token_ids"])
    mask = keras.ops.expand_dims(keras.ops.cast(inner["padding_mask"], embedded.dtype), -1)
    pooled = keras.ops.sum(embedded * mask, axis=1) / keras.ops.maximum(keras.ops.sum(mask, axis=1), 1.0)
    backbone = keras.Model(inner, keras.layers.Dense(16, activation="relu", name="dense")(pooled), name="backbone")
    outer = inputs()
    return keras.Model(outer, keras.layers.Dense(CLASSES, name="head")(backbone(outer)))
