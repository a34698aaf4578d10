"""How DTensor lowers an all-gather: CollectiveGatherV2 for a data-parallel mesh on CPUs, else TensorFlow's default.

An all-gather (with --shard-weights, each weight split on the batch axis, gathered whole for the forward) is by
default an all-reduce of zero-padded shards, sending and adding each whole tensor; with
LOWER_DTENSOR_GATHER_TO_COLLECTIVE_GATHER_V2 set (to any value) DTensor lowers it to CollectiveGatherV2, which passes
on each shard once (~25% off the sharded batch=8 step). Not on a mesh with a model axis, where it read a tensor
laid out [model, batch] back out of order. A mesh's functions are lowered while its trainer runs, so `settle` sets
the variable for each trainer as it starts; GPUs keep TensorFlow's default; your own value wins (0 is off).
Measurements and the isolated fault: docs/throughput.md, "Sharded data parallel".
"""

import os
from typing import Optional

VARIABLE = "LOWER_DTENSOR_GATHER_TO_COLLECTIVE_GATHER_V2"
OURS = "dtensor_impl.gathering"  # the value `settle` sets, told apart from yours (TensorFlow reads any as on)
GATHER = "CollectiveGatherV2"
ALL_REDUCE = "all-reduces of zero-padded shards"
_yours: Optional[str] = None  # your value, read at the first `settle`: "" when unset


def settle(device_type: str, model_axis: int) -> str:
    """Set the lowering for a trainer's mesh, before DTensor lowers any of its functions; say which it is."""
    global _yours
    if _yours is None:
        value = os.environ.get(VARIABLE, "")
        _yours = "" if value == OURS else value
    if _yours == "0" or not (_yours or (device_type == "CPU" and model_axis == 1)):
        os.environ.pop(VARIABLE, None)
    else:
        os.environ[VARIABLE] = _yours or OURS
    return GATHER if VARIABLE in os.environ else ALL_REDUCE
