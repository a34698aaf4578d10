"""One run's plan (shared/run/plan.py): the records are keyword-only, and train_and_judge trains only what the plan
does not hand it already trained."""

import dataclasses

import pytest

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.judge.ranking import SweepEntry
from dtensor_vs_mirrored.shared.run.plan import RunPlan, lineup
from dtensor_vs_mirrored.shared.run.sequence import RunResult, in_process, train_and_judge
from dtensor_vs_mirrored.shared.run.sweep import SweepPoint
from tests.cli import data_slice

SMALL = Config(trainers=("reference", "dtensor"), epochs=1, devices=2, batch_size=64, quiet=True, timing=False)


@pytest.mark.parametrize("record", [RunPlan, RunResult, SweepEntry, SweepPoint])
def test_a_runs_records_take_their_fields_by_name_only(record):
    fields = [field.name for field in dataclasses.fields(record)]
    with pytest.raises(TypeError, match="positional argument"):
        record(*[None] * len(fields))


def test_a_plan_is_frozen_and_keeps_only_where_it_is_timed_in_float32(embedded, devices):
    plan = RunPlan(config=SMALL, data=embedded, devices=devices, entries=lineup(SMALL), train=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.timed = True
    timed = dataclasses.replace(plan, timed=True, config=SMALL.replace(timing=True))
    assert (plan.control.keep, timed.control.keep) == (False, True)
    assert not dataclasses.replace(timed, config=timed.config.replace(dtype="float64")).control.keep
    assert dataclasses.replace(plan, evaluate=False).control.evaluate is False


def test_what_the_plan_hands_over_trained_is_judged_not_trained_again(embedded, devices):
    """A sweep's configuration: the reference's run and the trainer's, trained before (the main run's, a block's)."""
    data = data_slice(embedded, 256, 64)
    here, trained = in_process(data, devices), []

    def train(entry, config, control=None):
        trained.append(entry.key)
        return here(entry, config) if control is None else here(entry, config, control)

    plan = RunPlan(config=SMALL, data=data, devices=devices, entries=lineup(SMALL), train=train, log=lambda line: None)
    first = train_and_judge(plan)
    assert trained == ["reference", "dtensor"] and first.ok, first.verdicts
    again = train_and_judge(
        dataclasses.replace(
            plan, reference_result=first.results["reference"], trained={"dtensor": first.results["dtensor"]}
        )
    )
    assert trained == ["reference", "dtensor"]  # nothing trained the second time
    assert again.results == first.results
    assert again.parity["dtensor"].max_abs_loss_diff == first.parity["dtensor"].max_abs_loss_diff
    assert again.verdicts["dtensor"].verdict == first.verdicts["dtensor"].verdict
