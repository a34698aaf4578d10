"""check_parity's judgement on made-up histories: which differences fail, and over which steps."""
import numpy as np
import pytest

from shared.history import History
from shared.parity import DEFAULT_CHECKED_STEPS, DEFAULT_TOLERANCE, check_parity

WEIGHTS = [np.zeros((3, 2), np.float32), np.zeros(2, np.float32)]


def history(losses, weight_offset=0.0) -> History:
    return History("made-up", "nowhere", step_losses=list(losses), first_step_gradients=WEIGHTS,
                   final_weights=[w + weight_offset for w in WEIGHTS])


def drifting(steps: int, first_drifting_step: int, drift: float) -> list:
    return [1.0 + (drift if step >= first_drifting_step else 0.0) for step in range(steps)]


def test_equal_runs_pass():
    parity = check_parity(history([1.0] * 10), history([1.0] * 10))
    assert parity.ok and parity.max_abs_loss_diff == 0 and parity.weights_judged
    assert parity.checked_steps == DEFAULT_CHECKED_STEPS and parity.later_loss_diff == 0


def test_a_loss_difference_within_the_checked_steps_fails():
    parity = check_parity(history(drifting(10, 7, 1e-3)), history([1.0] * 10))
    assert not parity.ok and parity.loss_diff_step == 7
    assert parity.reason.startswith("loss differs by 0.001 > 0.0001")


def test_differences_after_the_checked_steps_are_reported_not_judged():
    candidate, reference = history(drifting(12, 9, 3e-3), 0.05), history([1.0] * 12)
    parity = check_parity(candidate, reference, checked_steps=8)
    assert parity.ok, parity.reason
    assert parity.max_abs_loss_diff == 0 and parity.later_loss_diff == pytest.approx(3e-3)
    assert not parity.weights_judged and parity.max_abs_weight_diff == pytest.approx(0.05)
    # The same run judged over all its steps fails on both.
    strict = check_parity(candidate, reference, checked_steps=12)
    assert not strict.ok and "loss differs" in strict.reason and "weight differs" in strict.reason


def test_final_weights_are_judged_when_the_run_fits_the_checked_steps():
    parity = check_parity(history([1.0] * 8, 2e-3), history([1.0] * 8), checked_steps=8)
    assert parity.weights_judged and not parity.ok
    assert parity.reason == f"weight differs by 0.002 > {10 * DEFAULT_TOLERANCE:.3g}"


def test_a_non_finite_loss_fails_even_after_the_checked_steps():
    losses = [1.0] * 11 + [float("nan")]
    parity = check_parity(history(losses), history([1.0] * 12), checked_steps=8)
    assert not parity.ok and parity.reason == "loss is not finite after step 8"


def test_runs_of_different_length_fail():
    parity = check_parity(history([1.0] * 9), history([1.0] * 10))
    assert not parity.ok and "9 steps, reference has 10" in parity.reason
