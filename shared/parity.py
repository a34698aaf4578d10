"""Parity: does a distributed trainer compute the same training run as the reference?

Three absolute differences against the reference's history record: the per-step
training loss (largest, and the step where it occurs), the first step's gradients
at the initial weights, and the final weights. Each must be within the tolerance.

DEFAULT_TOLERANCE comes from measurement (docs/parity.md): it sits
above the float noise seen between the reference and every mesh and device count
(summation order across devices changes the last bits) and at least 100 times
below the smallest loss divergence that `--adam tutorial` produces. It bounds the
loss and gradient differences. Final weights get WEIGHT_TOLERANCE_FACTOR times more:
float noise that flips one ReLU unit on one example changes that unit's Adam update
by up to a learning-rate step (1e-3 by default) per element and step, and 3 epochs
of the default run showed 1.8e-4 from that alone, while the tutorial's Adam moves
the weights by 2e-2 or more.

Float noise compounds in long runs: Adam scales each update by the gradient's own
size, so where a gradient is near zero a 1e-7 difference can flip a whole
learning-rate step, and a flipped ReLU changes the next steps' gradients. On the
default data the loss differences stayed below 5e-7 for 5 epochs (160 steps), then
reached 7e-5 in epoch 6 and 3e-3 by epoch 9, identically for DTensor and
MirroredStrategy. So the per-step losses are judged over the first `checked_steps`
(DEFAULT_CHECKED_STEPS, `--parity-steps`) and later ones only reported (`later_loss_diff`);
the final weights are judged when the whole run is within those steps.
"""
import dataclasses
from typing import Optional

import numpy as np

from shared.history import History

DEFAULT_TOLERANCE = 1e-4
WEIGHT_TOLERANCE_FACTOR = 10
DEFAULT_CHECKED_STEPS = 128  # covers 3 epochs of the default data (96 steps) and of tfds/IDX (120)


@dataclasses.dataclass
class Parity:
    max_abs_loss_diff: float
    loss_diff_step: int  # 0-based training step of the largest loss difference
    max_abs_grad_diff: float
    max_abs_weight_diff: float
    tolerance: float  # for the loss and gradient differences
    weight_tolerance: float  # for the final weights: WEIGHT_TOLERANCE_FACTOR x tolerance
    ok: bool
    reason: str = ""  # why not ok, in one line
    checked_steps: int = DEFAULT_CHECKED_STEPS  # the loss differences judged: steps 0 .. checked_steps - 1
    later_loss_diff: float = 0.0  # largest loss difference after those steps: reported, not judged
    weights_judged: bool = True  # False when the run is longer than checked_steps


def max_abs_diff(arrays, reference_arrays) -> float:
    """Largest |a - b| over paired arrays (in float64, so the difference itself is exact); 0 for none."""
    return max((float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                for a, b in zip(arrays, reference_arrays)), default=0.0)


def check_parity(candidate: History, reference: History, tolerance: Optional[float] = None,
                 checked_steps: Optional[int] = None) -> Parity:
    tolerance = DEFAULT_TOLERANCE if tolerance is None else tolerance
    checked_steps = DEFAULT_CHECKED_STEPS if checked_steps is None else checked_steps
    losses, reference_losses = np.asarray(candidate.step_losses), np.asarray(reference.step_losses)
    reasons = []
    if len(losses) != len(reference_losses):
        reasons.append(f"{len(losses)} steps, reference has {len(reference_losses)}")
    steps = min(len(losses), len(reference_losses))
    all_diffs = np.abs(losses[:steps] - reference_losses[:steps])
    loss_diffs, later_diffs = all_diffs[:checked_steps], all_diffs[checked_steps:]
    worst_step = int(np.nanargmax(loss_diffs)) if loss_diffs.size and not np.all(np.isnan(loss_diffs)) else 0
    max_loss = float(loss_diffs[worst_step]) if loss_diffs.size else 0.0
    if np.any(np.isnan(loss_diffs)):
        max_loss = float("nan")
    later = float(np.max(later_diffs)) if later_diffs.size else 0.0
    if not np.all(np.isfinite(later_diffs)):  # a NaN or inf loss is never float noise
        reasons.append(f"loss is not finite after step {checked_steps}")
    shapes = [np.shape(a) for a in candidate.final_weights], [np.shape(a) for a in reference.final_weights]
    if shapes[0] != shapes[1]:
        reasons.append("final weight shapes differ from the reference's")
    max_grad = max_abs_diff(candidate.first_step_gradients, reference.first_step_gradients)
    max_weight = max_abs_diff(candidate.final_weights, reference.final_weights)
    weight_tolerance = WEIGHT_TOLERANCE_FACTOR * tolerance
    weights_judged = max(len(losses), len(reference_losses)) <= checked_steps
    judged = [("loss", max_loss, tolerance), ("gradient", max_grad, tolerance)]
    if weights_judged:
        judged.append(("weight", max_weight, weight_tolerance))
    for name, value, bound in judged:
        if not value <= bound:  # NaN fails too
            reasons.append(f"{name} differs by {value:.3g} > {bound:.3g}")
    return Parity(max_loss, worst_step, max_grad, max_weight, tolerance, weight_tolerance,
                  not reasons, "; ".join(reasons), checked_steps, later, weights_judged)
