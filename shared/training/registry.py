"""The trainers by name: the one place that maps "dtensor" to dtensor_impl.trainer.

The run layer (shared/run/) reaches a trainer only through this registry, so no module of shared/ imports
a trainer package (tests/test_imports.py). Each module offers every part of
shared.training.protocol.TrainerModule; `trainer_module` checks that it does.
"""

import importlib
from typing import Dict, List

from shared.training.protocol import RunFacts, TrainerModule

TRAINER_MODULES = {
    "reference": "shared.training.reference",
    "dtensor": "dtensor_impl.trainer",
    "mirrored": "mirrored_impl.trainer",
}


def trainer_module(name: str) -> TrainerModule:
    module = importlib.import_module(TRAINER_MODULES[name])
    missing = [part for part in TRAINER_PARTS if not callable(vars(module).get(part))]
    if missing:
        raise TypeError(f"{TRAINER_MODULES[name]} lacks {', '.join(missing)} of shared.training.protocol.TrainerModule")
    return module


TRAINER_PARTS = tuple(
    name for name in vars(TrainerModule) if not name.startswith("_") and callable(vars(TrainerModule)[name])
)


def distributed(names) -> List[str]:
    """The trainers of `names` that distribute: every one but the reference."""
    return [name for name in names if name != "reference"]


def describe_runs(config) -> Dict[str, RunFacts]:
    """{trainer: facts the header prints before anything trains}, e.g. DTensor's mesh and per-replica batch."""
    return {name: trainer_module(name).describe_run(config) for name in config.trainers}
