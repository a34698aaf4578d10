"""DTensor's all-reduce combining: whether it is on in this process, decided once, before DTensor starts.

With DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION on (TensorFlow's default) a DVariable read
after an assign in the same tf.function returns the value from before the assign, so the DTensor
trainer then runs one step per call. DTensor reads the variable once per process, when it starts;
`settle` runs before anything of ours starts it: on CPUs it turns the combining off unless the
variable is set, and records what DTensor will read. If DTensor had started before, the combining
counts as on: correct, one step per call (docs/tutorial-differences.md, docs/parity.md).

Off, a small model unrolls several steps a call, which pays for a few variables (the MLP's 6); on, a model of
many variables sends one all-reduce for many, which pays more than the unrolling (the GPT's 38, the ViT's 39;
docs/throughput.md, "All-reduce combining"). So a trainer process (shared/run/sequence.py) of a run whose model
has more than COMBINE_ABOVE_VARIABLES trainable variables starts with the variable on (`environment`); your own
value, set before the run, wins.
"""

import os
from typing import Dict, Optional

from dtensor_vs_mirrored.shared.model.registry import definition_for

VARIABLE = "DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION"
COMBINE_ABOVE_VARIABLES = 16  # trainable variables: the MLP's 6 unroll, the GPT's 38 and the ViT's 39 combine
# Set beside the variable by `settle`, to the value it set: that value is ours, not yours, here and in every
# process started from here (a trainer process, a compare.py a test runs), which inherit both.
SETTLED = "COMPARE_COMBINING_SETTLED"
_combining_on: Optional[bool] = None  # what DTensor reads in this process; None until `settle`


def yours() -> Optional[str]:
    """The variable as you set it (in the shell, or in os.environ before the run); None where unset or `settle`'s."""
    value = os.environ.get(VARIABLE)
    return None if value is not None and os.environ.get(SETTLED) == value else value


def environment(config) -> Dict[str, str]:
    """A trainer process's part for this run (shared.config.Config): the combining on, on CPUs, for a model of more
    than COMBINE_ABOVE_VARIABLES trainable variables, unless you set the variable (yours is inherited) or train the
    tutorial's Adam (it reads its slots after assigning them: with the combining on, stale)."""
    tutorial = config.optimizer == "adam" and config.adam == "tutorial"
    if yours() is not None or config.device_type != "CPU" or tutorial:
        return {}
    many = len(definition_for(config).trainable_variables) > COMBINE_ABOVE_VARIABLES
    return {VARIABLE: "1"} if many else {}


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
            if device_type == "CPU" and VARIABLE not in os.environ:
                os.environ[VARIABLE] = os.environ[SETTLED] = "0"
            _combining_on = os.environ.get(VARIABLE) != "0"
    return _combining_on
