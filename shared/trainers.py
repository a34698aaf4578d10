"""The trainers by name: the one place that maps "dtensor" to dtensor_impl.trainer.

The comparison, the sweep and the --clients launcher sit above the trainers but live in shared/;
they reach a trainer through this registry, so no module of shared/ imports a trainer package
(tests/test_imports.py checks that packages import one way). A trainer module offers `fit`, and
where it has them `check_config`, `describe_run` (facts for the header), `sweep_configs` (its
variants at a device count) and `join_cluster` (--clients).
"""

import importlib

TRAINER_MODULES = {
    "reference": "shared.reference",
    "dtensor": "dtensor_impl.trainer",
    "mirrored": "mirrored_impl.trainer",
}


def trainer_module(name: str):
    return importlib.import_module(TRAINER_MODULES[name])


def describe_runs(config) -> dict:
    """{trainer: facts the header prints before anything trains}, e.g. DTensor's mesh and per-replica batch."""
    facts = {}
    for name in config.trainers:
        describe = getattr(trainer_module(name), "describe_run", None)
        if describe is not None:
            facts[name] = describe(config)
    return facts
