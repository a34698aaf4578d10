"""DTensor's all-reduce combining: whether it is on in this process, decided once, before DTensor starts.

DTensor can combine a function's independent all-reduces into one
(DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION; on unless the variable is exactly "0").
Two facts make it matter here:

- With it on, a DVariable read after an assign in the same tf.function returns the value
  from before the assign (docs/tutorial-differences.md). The DTensor trainer's calls of
  several unrolled steps would then read the weights from before the previous step's update,
  so while it is on the trainer runs one step per call (trainer.steps_per_call).
- DTensor reads the variable once per process, when it creates its device (the first DTensor
  op), not per compiled function. Measured (TensorFlow 2.21, 8 CPUs): one DTensor op before
  the variable was set to "0" left the combining on for the whole process, and 4-step calls
  then trained 0.53 off the reference within one 4-step epoch.

So `settle` runs before anything of ours starts DTensor (`mesh.create_mesh`,
`shared.multiclient.join_cluster`, `trainer.fit`): on CPUs it turns the combining off unless
you set the variable (each gradient all-reduced on its own ran ~14% faster there:
docs/throughput.md), and records what DTensor will read. If DTensor had started before
(your own DTensor code in the same process), the setting it read is unknown, and the
combining counts as on: correct, one step per call.
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
