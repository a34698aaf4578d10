"""The trainers by name: one `TrainerSpec` each, registered by its package (shared/training/reference.py,
dtensor_impl/spec.py, mirrored_impl/spec.py), and the one `fit` that trains any of them.

The run layer (shared/run/) reaches a trainer only through this registry, so no module of shared/ imports a
trainer package (tests/test_imports.py resolves the module names below as imports).
"""

import importlib
from typing import Dict, List, Optional, Sequence

from shared.config import Config
from shared.measure.history import History
from shared.training import loop
from shared.training.data import Dataset
from shared.training.protocol import PLAIN_RUN, Progress, RunControl, RunFacts, Silent, TrainerSpec

SPEC_MODULES = {  # each module's SPEC; shared.config.TRAINER_NAMES lists the same names (a test keeps them equal)
    "reference": "shared.training.reference",
    "dtensor": "dtensor_impl.spec",
    "mirrored": "mirrored_impl.spec",
}


def trainer_spec(name: str) -> TrainerSpec:
    spec = importlib.import_module(SPEC_MODULES[name]).SPEC
    if not isinstance(spec, TrainerSpec) or spec.name != name:
        raise TypeError(f"{SPEC_MODULES[name]}.SPEC is not the TrainerSpec of {name}")
    return spec


def specs(names: Sequence[str] = tuple(SPEC_MODULES)) -> List[TrainerSpec]:
    return [trainer_spec(name) for name in names]


def distributed(names: Sequence[str]) -> List[str]:
    """The trainers of `names` that distribute: every one but the reference."""
    return [name for name in names if trainer_spec(name).distributes]


def fit(
    name: str,
    config: Config,
    data: Dataset,
    devices: Sequence[str],
    progress: Optional[Progress] = None,
    control: Optional[RunControl] = None,
) -> History:
    """Train trainer `name` on exactly `devices` (every client's with --clients) and return its history;
    `progress`: what it prints as it trains (shared/report/progress.py; None: nothing)."""
    spec = trainer_spec(name)
    progress = progress or Silent()
    spec.check_config(config, devices)
    make, count_bytes = spec.trainer, spec.count_bytes
    if config.fit:  # Keras's model.fit in this trainer's place: its steps are Keras's, their bytes not counted
        make, count_bytes = spec.fit_trainer, lambda trainer: (None, "not counted: Keras's model.fit (--fit)")
    with spec.scope(devices):
        trainer = make(config, data, devices, progress.line)
        return loop.fit(trainer, config, data, progress, count_bytes, control or PLAIN_RUN)


def describe_runs(config: Config) -> Dict[str, RunFacts]:
    """{trainer: facts the header prints before anything trains}, e.g. DTensor's mesh and per-replica batch."""
    return {name: trainer_spec(name).describe_run(config) for name in config.trainers}
