"""A float64 run that rounds nothing to float32, where a layer's own code computes in float32.

keras-hub's layers do so for bfloat16 and float16 models: Gemma's attention makes `keras.layers.Softmax(dtype=
"float32")` in its `__init__` (in no config, so the float64 copy rebuilt from the config keeps it float32), and its
RMSNormalization casts, "Always compute normalization in float32" (`ops.cast(x, "float32")`). In a float64 run that
rounds activations to float32; distributed trainers, summing in other orders, cross float32 roundings one device
does not: Gemma's gradients were 1.1e-8 apart in float64 and Adam's v of its norm scales left their bound, a false
MISMATCH. Kept in float64 they agree to 1e-16 (docs/keras.md, "A keras-hub backbone").

So in the float64 copy a variable-free layer fixed to float32 computes in float64 (Keras's public `dtype_policy`
setter), and while it computes `keras.ops.cast` of a float64 tensor to float32 keeps it float64. `keras.ops.cast` is
replaced once in the process by a wrapper that is Keras's own cast outside `keeping_float64` (a thread's own:
MirroredStrategy traces each replica's forward in its own thread); code that imported the function itself (`from
keras.ops import cast`) is not reached. Checked on Keras 3.15.1 with keras-hub 0.32.0.
"""

import contextlib
import threading
from typing import Iterator, List, Tuple

from dtensor_vs_mirrored.shared.model import keras_compat

_state = threading.local()  # per thread: the casts kept while in keeping_float64, else None
_install = threading.Lock()
_casts_installed = []  # the cast this module put in keras.ops: installed once per process


def float64_in_code(copy, probe) -> Tuple[bool, List[str]]:
    """(whether the float64 `copy` computes with keeping_float64, what the header says): its variable-free layers
    fixed to float32 set to float64, and its casts to float32 found on `probe`; a copy that cannot compute with them
    kept float64 (the layer adds a float32 tensor by a TensorFlow op) casts as its code says, and the header says so."""
    pinned = widen_pinned(copy)
    try:
        with keeping_float64() as kept:
            copy(probe, training=False)
    except Exception as error:  # noqa: BLE001 - any error: the casts stay as the layers' code has them
        for layer in pinned:  # as its code has it: the copy computes as it does without keeping_float64
            layer.dtype_policy = "float32"
        raised = type(error).__name__
        left = f"float32 in its layers' code stays float32 in a float64 run (kept float64: {raised})"
        return False, [left]
    return bool(kept[0]), float64_note(pinned, ["keras.ops.cast to float32"] if kept[0] else [])


def widen_pinned(copy) -> list:
    """Every variable-free layer of the float64 `copy` that still computes in float32, set to float64; those layers.
    (A float32 variable is refused as it is: shared/model/keras.py rebuilt.)"""
    pinned = [
        layer
        for layer in keras_compat.flat_layers(copy)
        if not layer.variables
        and type(layer).__name__ != "InputLayer"
        and getattr(layer, "dtype_policy", None) is not None
        and layer.dtype_policy.compute_dtype == "float32"
    ]
    for layer in pinned:
        layer.dtype_policy = "float64"
    return pinned


@contextlib.contextmanager
def keeping_float64(active: bool = True) -> Iterator[List[int]]:
    """While active, `keras.ops.cast(x, "float32")` of a float64 `x` returns it float64; yields [casts kept]."""
    kept = [0]
    if not active:
        yield kept
        return
    _installed()
    outer = getattr(_state, "kept", None)
    _state.kept = kept
    try:
        yield kept
    finally:
        _state.kept = outer


def float64_note(pinned: list, casts: List[str]) -> List[str]:
    """The header's words for the float32 in the copy's layers' code; [] where there is none."""
    kinds = " and ".join(sorted({type(layer).__name__ for layer in pinned}))
    found = ([f"{len(pinned)} {kinds} fixed to float32"] if pinned else []) + casts
    return [f"float32 in its layers' code kept float64 in a float64 run: {', '.join(found)}"] if found else []


def _installed() -> None:
    import keras

    with _install:
        if keras.ops.cast in _casts_installed:
            return
        original = keras.ops.cast

        def cast(x, dtype):
            kept = getattr(_state, "kept", None)
            if kept is not None and _name(dtype) == "float32" and _name(getattr(x, "dtype", None)) == "float64":
                kept[0] += 1
                return original(x, "float64")
            return original(x, dtype)

        cast.__doc__ = original.__doc__
        keras.ops.cast = cast
        _casts_installed.append(cast)


def _name(dtype) -> str:
    import keras

    try:
        return keras.backend.standardize_dtype(dtype) if dtype is not None else ""
    except ValueError:
        return ""
