"""Parity and verdicts on made-up histories: the tolerance rule, every step judged, the first
step and the variables that differ, divergence, and the float64 explanation of a float32 failure."""

import types

import numpy as np
import pytest

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.judge.parity import TOLERANCES, check_parity, first_non_finite_step
from dtensor_vs_mirrored.shared.judge.verdict import DIVERGED, FLOAT_NOISE, MISMATCH, OK, explain, judge, rerun_line
from dtensor_vs_mirrored.shared.measure.history import History
from dtensor_vs_mirrored.shared.model.mlp import summarise_state

pytestmark = pytest.mark.fast  # the release matrix runs these on every TensorFlow release

WEIGHTS = [np.full((3, 2), 0.5), np.full(2, 0.5)]
NAMES = [
    "layer 0 weight",
    "layer 0 bias",
    "layer 0 weight Adam m",
    "layer 0 bias Adam m",
    "layer 0 weight Adam v",
    "layer 0 bias Adam v",
]


def history(losses, weight_offset=0.0, dtype="float32", name="made-up", state=None) -> History:
    """A history of `losses`; `state` [steps + 1, variables] checksums (float64 runs record them)."""
    return History(
        name,
        "nowhere",
        step_losses=list(losses),
        first_step_gradients=WEIGHTS,
        final_weights=[w + weight_offset for w in WEIGHTS],
        dtype=dtype,
        step_state_checksums=list(state) if state is not None else [],
        state_names=NAMES if state is not None else [],
    )


def drifting(steps: int, first_drifting_step: int, drift: float, start: float = 1.0) -> list:
    return [start + (drift if step >= first_drifting_step else 0.0) for step in range(steps)]


def test_equal_runs_pass_with_every_step_judged():
    parity = check_parity(history([1.0] * 300), history([1.0] * 300))
    assert parity.ok and parity.steps == 300 and parity.max_abs_loss_diff == 0
    assert parity.first_step_beyond is None and parity.tolerances["loss"] == (1e-4, 1e-4)


def test_the_bound_is_absolute_plus_relative_to_the_reference():
    # float32 loss bound: 1e-4 + 1e-4 |reference|: 2e-4 at a loss of 1, ~1e13 at 1e17.
    assert check_parity(history(drifting(4, 2, 1.9e-4)), history([1.0] * 4)).ok
    assert not check_parity(history(drifting(4, 2, 2.1e-4)), history([1.0] * 4)).ok
    huge = [2.8e17] * 4
    assert check_parity(history(drifting(4, 0, 2e13, 2.8e17)), history(huge)).ok  # rel 7e-5
    assert not check_parity(history(drifting(4, 0, 3e13, 2.8e17)), history(huge)).ok  # rel 1.1e-4


def test_a_late_difference_fails_no_window():
    parity = check_parity(history(drifting(320, 290, 1e-3)), history([1.0] * 320))
    assert not parity.ok and parity.first_loss_step_beyond == 290 and parity.first_step_beyond == 290
    assert parity.reason.startswith("loss differs from step 290 on (by up to 0.001 at step 290")


def test_final_weights_and_gradients_have_their_own_bounds():
    assert check_parity(history([1.0] * 8, 1.4e-3), history([1.0] * 8)).ok  # 1e-3 + 1e-3 x 0.5
    parity = check_parity(history([1.0] * 8, 1.6e-3), history([1.0] * 8))
    assert not parity.ok and parity.reason == "final weights differ by 0.0016"
    assert parity.first_step_beyond is None  # float32 records no state: the weights say only "by the end"


def test_tolerance_option_sets_atol_and_rtol_in_the_runs_dtype():
    parity = check_parity(history(drifting(4, 1, 5e-3)), history([1.0] * 4), tolerance=1e-2)
    assert parity.ok and parity.tolerances["loss"] == (1e-2, 1e-2) and parity.tolerances["weight"] == (0.1, 0.1)
    # float64 judges with its own, far tighter bounds: what float32 calls equal, float64 does not.
    atol, rtol = parity_bound = (TOLERANCES["float64"]["loss"].atol, TOLERANCES["float64"]["loss"].rtol)
    float64 = check_parity(history([1.0 + 3 * (atol + rtol)] * 4, dtype="float64"), history([1.0] * 4, dtype="float64"))
    assert not float64.ok and float64.tolerances["loss"] == parity_bound
    assert check_parity(history([1.0 + 3 * (atol + rtol)] * 4), history([1.0] * 4)).ok


def test_float64_state_checksums_name_the_first_step_and_the_variables():
    steps = 6
    state = np.ones((steps + 1, len(NAMES)))
    moved = state.copy()
    moved[3:, 0] *= 1.001  # layer 0 weight differs after step 2's update ...
    moved[4:, 2:] *= 1.01  # ... and every Adam slot after step 3's
    losses = drifting(steps, 3, 1e-3)  # so step 3's loss differs too
    parity = check_parity(
        history(losses, dtype="float64", state=moved), history([1.0] * steps, dtype="float64", state=state)
    )
    assert not parity.ok and parity.state_judged
    assert (parity.first_step_beyond, parity.differing) == (2, ["layer 0 weight"])
    assert parity.first_loss_step_beyond == 3
    assert parity.state_first_steps == {"layer 0 weight": 2, **{name: 3 for name in NAMES[2:]}}


def test_a_difference_in_the_initial_state_is_named_at_step_0():
    state = np.ones((3, len(NAMES)))
    moved = state.copy()
    moved[:, 1] += 1.0
    parity = check_parity(
        history([1.0] * 2, dtype="float64", state=moved), history([1.0] * 2, dtype="float64", state=state)
    )
    assert (parity.first_step_beyond, parity.differing) == (0, ["initial layer 0 bias"])


def test_a_variable_of_pure_rounding_noise_is_judged_against_its_kinds_scale():
    """A key bias in attention has a gradient that is 0 in exact arithmetic: its Adam slots hold
    float64 rounding (~1e-18) that differs between runs by 100%. Judged relative to its own sum it
    would be a MISMATCH; judged with its kind's scale (the weight's slots, ~1e-2 per element) it is not.
    A real difference in the same variable, at its kind's scale, still is."""
    sizes = [6, 2, 6, 2, 6, 2]
    state = np.array([[3.0, 1.0, 6e-2, 2e-18, 6e-6, 4e-36]] * 3)
    noise = state.copy()
    noise[1:, 3] = 4e-18  # the bias's Adam m: noise of a different size
    noise[1:, 5] = 1e-36
    runs = [
        History(
            "made-up",
            "nowhere",
            step_losses=[1.0, 1.0],
            first_step_gradients=WEIGHTS,
            final_weights=WEIGHTS,
            dtype="float64",
            step_state_checksums=list(checksums),
            state_names=NAMES,
            state_sizes=sizes,
        )
        for checksums in (noise, state)
    ]
    assert check_parity(*runs).ok
    real = noise.copy()
    real[2, 3] = 2e-18 + 1e-11  # the bias's m moved by 1e-11: 5e-12 per element, beyond 1e-3 x 1e-7 x 1e-2
    runs[0].step_state_checksums = list(real)
    parity = check_parity(*runs)
    assert not parity.ok and parity.state_first_steps == {"layer 0 bias Adam m": 1}
    runs[0].state_sizes = runs[1].state_sizes = []  # without sizes: relative only, the noise is a difference
    runs[0].step_state_checksums = list(noise)
    assert not check_parity(*runs).ok


def test_state_names_are_grouped_in_messages():
    assert summarise_state(NAMES, NAMES) == "every weight, bias and Adam slot"
    assert summarise_state(NAMES[:2], NAMES) == "every weight and bias"
    assert summarise_state(NAMES[2:], NAMES) == "every Adam slot"
    assert summarise_state(["layer 0 bias", "layer 0 weight Adam v"], NAMES) == "every bias, every weight Adam v"


def test_non_finite_losses_and_weights_are_divergence():
    assert first_non_finite_step(history([1.0, 2.0, float("nan"), float("nan")])) == 2
    assert first_non_finite_step(history([1.0, float("inf")])) == 1
    assert first_non_finite_step(history([1.0, 2.0], weight_offset=float("nan"))) == 2  # after the last step
    assert first_non_finite_step(history([1.0, 2.0])) is None
    assert not check_parity(history([1.0, float("nan")]), history([1.0, float("nan")])).ok  # NaN is never close


def test_runs_of_different_length_fail():
    parity = check_parity(history([1.0] * 9), history([1.0] * 10))
    assert not parity.ok and "9 steps, reference has 10" in parity.reason


def test_missing_first_step_gradients_fail_rather_than_compare_nothing():
    candidate = history([1.0] * 3)
    candidate.first_step_gradients = []  # what a trainer whose first train call never ran would have
    parity = check_parity(candidate, history([1.0] * 3))
    assert not parity.ok and f"0 first-step gradients, reference has {len(WEIGHTS)}" in parity.reason


# --- verdicts ---------------------------------------------------------------------------------


def results(**histories):
    return {name: types.SimpleNamespace(history=h, error="") for name, h in histories.items()}


def judged(config, runs, rerun=None, no_rerun_reason=""):
    """shared.judge.verdict as the run layer calls it: judge, rerun in float64 what it names, explain; the
    lines the run logs."""
    parity = {
        name: check_parity(result.history, runs["reference"].history)
        for name, result in runs.items()
        if name != "reference"
    }
    histories = {name: result.history for name, result in runs.items()}
    judgement = judge(config, histories, parity, summarise_state, no_rerun_reason or ("" if rerun else "no rerun"))
    lines = [rerun_line(name, parity[name]) for name in judgement.needs_float64]
    if judgement.needs_float64:
        explain(judgement, parity, rerun(["reference"] + judgement.needs_float64), summarise_state, 0.0)
    return judgement, lines


def float64_rerun(candidate_losses):
    """A rerun that returns float64 histories: the reference's and the trainers' (made-up)."""
    calls = []

    def rerun(names):
        calls.append(list(names))
        return results(
            reference=history([1.0] * 100, dtype="float64"),
            **{name: history(candidate_losses, dtype="float64") for name in names if name != "reference"},
        )

    return rerun, calls


def test_float32_failure_that_float64_explains_is_float_noise():
    runs = results(
        reference=history([1.0] * 100), dtensor=history(drifting(100, 87, 3e-4)), mirrored=history([1.0] * 100)
    )
    rerun, calls = float64_rerun([1.0 + 1e-13] * 100)
    judgement, lines = judged(Config(), runs, rerun)
    assert calls == [["reference", "dtensor"]]  # only the failing trainer, with the reference
    noise = judgement.verdicts["dtensor"]
    assert noise.verdict == FLOAT_NOISE and noise.ok and noise.float32_left_tolerance_step == 87
    assert noise.line().startswith("float noise: float32 left its tolerance at step 87 (loss diff up to 0.0003")
    assert "float64 agrees on all 100 steps (max loss diff 1e-13" in noise.line()
    assert judgement.verdicts["mirrored"].verdict == OK
    # What prints under the parity table and in the log: one line; the figures are the table's and the JSON's.
    assert noise.short_reason() == "float32 left its tolerance at step 87; float64 agrees on all 100 steps"
    assert (
        lines[0]
        == "dtensor: float32 left its tolerance at step 87; rerunning reference and dtensor in float64 to explain"
    )
    assert set(judgement.float64_histories) == {"reference", "dtensor"} and judgement.explain_seconds >= 0


def test_float32_failure_that_float64_repeats_is_a_mismatch_at_its_first_step():
    runs = results(reference=history([1.0] * 100), dtensor=history(drifting(100, 5, 0.02)))
    rerun, _ = float64_rerun(drifting(100, 5, 0.02))
    verdict = judged(Config(), runs, rerun)[0].verdicts["dtensor"]
    assert verdict.verdict == MISMATCH and not verdict.ok and verdict.first_disagreeing_step == 5
    assert verdict.line().startswith("MISMATCH at step 5: loss (in float64; float32 left its tolerance at step 5 (")
    assert verdict.short_reason() == "at step 5: loss (in float64; float32 left its tolerance at step 5)"


def test_without_a_rerun_a_float32_failure_is_a_mismatch_that_says_why():
    runs = results(reference=history([1.0] * 10), dtensor=history(drifting(10, 7, 1e-3)))
    verdict = judged(Config(explain=False), runs)[0].verdicts["dtensor"]
    assert verdict.line() == "MISMATCH at step 7: loss (float32, not rerun in float64: --no-explain)"
    assert verdict.short_reason() == verdict.reason  # no figures to leave out
    verdict = judged(Config(), runs, None, "clients started by hand")[0].verdicts["dtensor"]
    assert verdict.line().endswith("(float32, not rerun in float64: clients started by hand)")


def test_a_float64_run_is_judged_without_a_rerun():
    runs = results(
        reference=history([1.0] * 10, dtype="float64"), dtensor=history(drifting(10, 3, 1e-6), dtype="float64")
    )
    verdict = judged(Config(dtype="float64"), runs)[0].verdicts["dtensor"]
    assert verdict.line() == "MISMATCH at step 3: loss"


@pytest.mark.parametrize(
    "reference_losses, candidate_losses, rows",
    [
        # Both diverge: each says where; neither is rerun.
        (
            [1.0, 2.0, 3.0, float("nan")],
            [1.0, 2.0, 3.0, float("nan")],
            {
                "reference": "diverged at step 3: loss nan",
                "dtensor": "diverged at step 3: loss nan (the reference diverged at step 3); "
                "steps 0-2 agree within the tolerance",
            },
        ),
        # Only the trainer diverges.
        (
            [1.0, 2.0, 3.0, 4.0],
            [1.0, 2.0, float("inf"), float("nan")],
            {
                "dtensor": "diverged at step 2: loss inf (the reference stays finite); "
                "steps 0-1 agree within the tolerance"
            },
        ),
        # Only the reference diverges: its row says so, and the trainer's verdict is diverged too.
        (
            [1.0, float("nan"), float("nan")],
            [1.0, 1.5, 1.7],
            {
                "reference": "diverged at step 1: loss nan",
                "dtensor": "diverged: the reference diverged at step 1; this trainer stays finite; "
                "steps 0-0 agree within the tolerance",
            },
        ),
    ],
)
def test_divergence_is_its_own_verdict_and_fails_the_run(reference_losses, candidate_losses, rows):
    runs = results(reference=history(reference_losses), dtensor=history(candidate_losses))
    rerun, calls = float64_rerun([1.0] * 4)
    judgement, _ = judged(Config(), runs, rerun)
    assert {name: v.line() for name, v in judgement.verdicts.items()} == rows
    assert all(v.verdict == DIVERGED and not v.ok for v in judgement.verdicts.values())
    assert calls == []  # no float64 rerun for a diverged run
