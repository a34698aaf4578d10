"""How DTensor lowers an all-gather: CollectiveGatherV2 on CPUs, else TensorFlow's default.

An all-gather (with --shard-weights, each weight split on the batch axis, gathered whole for the forward) is by
default an all-reduce of zero-padded shards, sending and adding each whole tensor; with
LOWER_DTENSOR_GATHER_TO_COLLECTIVE_GATHER_V2 set (to any value) DTensor lowers it to CollectiveGatherV2, which passes
on each shard once (a faster sharded step). With it a [model, batch] tensor relaid out to replicated
comes back out of order; the trainer reads its weights back without that relayout (variables.to_numpy assembles
the pieces on the host), so it is on for every mesh of one client; across --clients a model-axis mesh keeps the
default, where to_numpy relays out. `settle` sets the variable for each trainer as it starts (a mesh's functions
are lowered while it runs); GPUs keep TensorFlow's default; your own value wins (0 is off). The isolated fault:
docs/throughput.md, "Sharded data parallel"; what it saves: docs/measurements.md.
"""

import os
from typing import Optional

VARIABLE = "LOWER_DTENSOR_GATHER_TO_COLLECTIVE_GATHER_V2"
OURS = "dtensor_impl.gathering"  # the value `settle` sets, told apart from yours (TensorFlow reads any as on)
GATHER = "CollectiveGatherV2"
ALL_REDUCE = "all-reduces of zero-padded shards"
_yours: Optional[str] = None  # your value, read at the first `settle`: "" when unset


def settle(device_type: str, model_axis: int, clients: int = 1) -> str:
    """Set the lowering for a trainer's mesh, before DTensor lowers any of its functions; say which it is."""
    global _yours
    if _yours is None:
        value = os.environ.get(VARIABLE, "")
        _yours = "" if value == OURS else value
    ours = device_type == "CPU" and (clients == 1 or model_axis == 1)
    if _yours == "0" or not (_yours or ours):
        os.environ.pop(VARIABLE, None)
    else:
        os.environ[VARIABLE] = _yours or OURS
    return GATHER if VARIABLE in os.environ else ALL_REDUCE
