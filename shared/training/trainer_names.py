"""The trainers' names, each with the module that registers its spec (registry.py imports them from here), and
--trainers' check: without TensorFlow, so that compare.py refuses a name, and writes its --help, before it starts."""

from typing import Optional, Sequence

from dtensor_vs_mirrored.shared.errors import UsageError

SPEC_MODULES = {  # each module's SPEC, named as here (registry.trainer_spec checks it)
    "reference": "dtensor_vs_mirrored.shared.training.reference",
    "dtensor": "dtensor_vs_mirrored.dtensor_impl.spec",
    "mirrored": "dtensor_vs_mirrored.mirrored_impl.spec",
}


def check_trainer_names(trainers: Optional[Sequence[str]]) -> None:
    """UsageError naming --trainers for a name no spec has, or for none at all (None: the registry's default)."""
    if trainers is None:
        return
    unknown = [name for name in trainers if name not in SPEC_MODULES]
    if unknown or not trainers:
        shown = ",".join(unknown) if unknown else repr(",".join(trainers))
        raise UsageError(f"unknown trainer {shown}; choose from {','.join(SPEC_MODULES)}", field="trainers")
