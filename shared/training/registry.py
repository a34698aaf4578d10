"""The trainers by name: one `TrainerSpec` each, registered by its package (shared/training/reference.py,
dtensor_impl/spec.py, mirrored_impl/spec.py; their names in trainer_names.py), the run's trainers when --trainers
is left to its default (`chosen`), and the one `fit` that trains any of them.

The run layer (shared/run/) reaches a trainer only through this registry, so no module of shared/ imports a
trainer package (tests/test_imports.py resolves the module names of trainer_names.py as imports).
"""

import importlib
from typing import Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.measure import timing
from dtensor_vs_mirrored.shared.measure.history import History
from dtensor_vs_mirrored.shared.model.definition import Caution
from dtensor_vs_mirrored.shared.model.registry import definition_for
from dtensor_vs_mirrored.shared.training import loop
from dtensor_vs_mirrored.shared.training.data import Dataset
from dtensor_vs_mirrored.shared.training.protocol import (
    PLAIN_RUN,
    Progress,
    RunControl,
    RunFacts,
    Silent,
    Trainer,
    TrainerSpec,
)
from dtensor_vs_mirrored.shared.training.trainer_names import SPEC_MODULES, check_trainer_names


def trainer_spec(name: str) -> TrainerSpec:
    check_trainer_names([name])
    spec = importlib.import_module(SPEC_MODULES[name]).SPEC
    if not isinstance(spec, TrainerSpec) or spec.name != name:
        raise TypeError(f"{SPEC_MODULES[name]}.SPEC is not the TrainerSpec of {name}")
    return spec


def specs(names: Sequence[str] = tuple(SPEC_MODULES)) -> List[TrainerSpec]:
    return [trainer_spec(name) for name in names]


def chosen(config: Config) -> Tuple[str, ...]:
    """The run's trainers: --trainers, or by default every registered one; under --fit those with a model.fit."""
    if config.trainers is not None:
        check_trainer_names(config.trainers)
        return tuple(config.trainers)
    return tuple(spec.name for spec in specs() if not config.fit or spec.fit_trainer is not None)


def with_trainers(config: Config) -> Config:
    """`config` with its trainers named (chosen): what a run hands its trainer processes, clients and reports."""
    return config if config.trainers is not None else config.replace(trainers=chosen(config))


def cautions_for(config: Config, train_examples: int) -> Tuple[Caution, ...]:
    """The run's cautions: with --fit those of model.fit in each trainer's place (its spec's fit_cautions: what
    makes it compute otherwise than on one device), else the model's own (ModelDefinition.cautions)."""
    if not config.fit:
        return definition_for(config).cautions
    return tuple(caution for spec in specs(chosen(config)) for caution in spec.fit_cautions(config, train_examples))


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
    return fit_and_keep(name, config, data, devices, progress, control)[0]


def fit_and_keep(
    name: str,
    config: Config,
    data: Dataset,
    devices: Sequence[str],
    progress: Optional[Progress] = None,
    control: Optional[RunControl] = None,
) -> Tuple[History, Optional["Kept"]]:
    """`fit`, and with control.keep the trained trainer kept for timing (None without)."""
    spec = trainer_spec(name)
    progress, control = progress or Silent(), control or PLAIN_RUN
    spec.check_config(config, devices)
    make, count_bytes = spec.trainer, spec.count_bytes
    if config.fit:  # Keras's model.fit in this trainer's place: its steps are Keras's, their bytes not counted
        make, count_bytes = spec.fit_trainer, lambda trainer: (None, "not counted: Keras's model.fit (--fit)")
    with spec.scope(devices):
        trainer = make(config, data, devices, progress.line)
        history = loop.fit(trainer, config, data, progress, count_bytes, control)
    return history, Kept(trainer, lambda: spec.scope(devices)) if control.keep else None


def kept_untrained(name: str, config: Config, data: Dataset, devices: Sequence[str], steps: int) -> "Kept":
    """A trainer made here and not trained, kept for timing, its call of `steps` steps warmed now: the reference's
    timing rounds where its runs train in a trainer process (shared.run.lanes.reference_apart). Its weights are
    the initial ones: a step's time does not depend on them."""
    spec = trainer_spec(name)
    with spec.scope(devices):
        trainer = (spec.fit_trainer if config.fit else spec.trainer)(config, data, devices, Silent().line)
    kept = Kept(trainer, lambda: spec.scope(devices))
    kept.warm(steps)
    return kept


class Kept:
    """A trained trainer kept for timing (shared/measure/timing.py): more rounds of its steady train call, on the
    batches it trained on, of at most the first round's steps where its trace runs any count (Trainer.step_call).
    The first round is preceded by a warm-up call; the weights step on."""

    def __init__(self, trainer: Trainer, scope: Callable[[], ContextManager]):
        self.trainer, self.scope, self.call, self.timed = trainer, scope, None, False

    def warm(self, steps: int) -> None:
        """Its call of `steps` steps made and run once, if it has none yet: nothing traced or compiled is timed."""
        with self.scope():
            if self.call is None:
                self.call = self.trainer.step_call(steps)
                self.call.run(self.call.prepare())

    def time(self, steps: int = timing.ROUND_STEPS) -> timing.TimedRound:
        with self.scope():
            if self.call is not None and not self.timed:  # warmed long before (kept_untrained): once more, untimed
                self.call.run(self.call.prepare())
            self.warm(steps)
            self.timed = True
            return timing.time_round(self.call, steps)

    def release(self) -> None:
        self.trainer = self.call = None


def describe_runs(config: Config) -> Dict[str, RunFacts]:
    """{trainer: facts the header prints before anything trains}, e.g. DTensor's mesh and per-replica batch."""
    return {name: trainer_spec(name).describe_run(config) for name in chosen(config)}
