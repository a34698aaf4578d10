"""DTensor's all-reduce combining: whether it is on in this process, decided once, before DTensor starts.

With DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION on (TensorFlow's default) a DVariable read
after an assign in the same tf.function returns the value from before the assign, so the DTensor
trainer then runs one step per call. DTensor reads the variable once per process, when it starts;
`settle` runs before anything of ours starts it: on CPUs it turns the combining off unless you set
the variable (~14% faster), and records what DTensor will read. If DTensor had started before, the
combining counts as on: correct, one step per call (docs/tutorial-differences.md, docs/parity.md).
"""

import os
from typing import Optional

VARIABLE = "DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION"
_combining_on: Optional[bool] = None  # what DTensor reads in this process; None until `settle`


def _dtensor_started() -> bool:
    """Has DTensor created its device in this process? A private attribute that TensorFlow 2.12
    to 2.21 all have (tests/test_dtensor_mesh.py); without it, assume it has."""
    from tensorflow.dtensor.python import api

    return getattr(api, "_dtensor_singleton", True) is not None


def settle(device_type: str) -> bool:
    """Fix the combining for this process (off on CPUs unless the variable is set); True when on."""
    global _combining_on
    if _combining_on is None:
        if _dtensor_started():
            _combining_on = True  # it read the variable before we could see it: assume TensorFlow's default
        else:
            if device_type == "CPU":
                os.environ.setdefault(VARIABLE, "0")
            _combining_on = os.environ.get(VARIABLE) != "0"
    return _combining_on
