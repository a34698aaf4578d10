"""--repeat N: each trainer trained N times from the same start, in one process. Are the runs the same bit for bit?

    python compare.py --repeat 2 --data embedded                  # op determinism off (TensorFlow's default)
    python compare.py --repeat 2 --data embedded --deterministic  # tf.config.experimental.enable_op_determinism()

Every later run is compared with the first: every step's loss and every final weight, bit for
bit. The answer is `bitwise identical`, or the first step whose loss differs and the largest
differences. It is a finding, not a verdict: it does not change the exit code. What each
setting gave, measured: docs/reproducibility.md. Cost: the training time again per extra run.
"""

import dataclasses
from typing import List, Optional, Sequence

import numpy as np

from dtensor_vs_mirrored.shared.judge.digest import weight_names
from dtensor_vs_mirrored.shared.judge.parity import max_abs_diff
from dtensor_vs_mirrored.shared.measure.history import History

BITWISE_IDENTICAL = "bitwise identical"


@dataclasses.dataclass
class Repeatability:
    runs: int  # the first run and its repeats
    bitwise_identical: bool
    # The first step whose loss differs in any bit from the first run's; the step count when only the
    # final weights differ; None when identical.
    first_differing_step: Optional[int] = None
    max_abs_loss_diff: float = 0.0
    max_abs_weight_diff: float = 0.0
    differing_weights: List[str] = dataclasses.field(default_factory=list)  # arrays not bit for bit the same
    error: str = ""  # a repeat that raised, in one line

    def line(self) -> str:
        if self.error:
            return f"FAILED: {self.error}"
        if self.bitwise_identical:
            return f"{BITWISE_IDENTICAL} ({self.runs} runs)"
        weights = (
            f"final weights by up to {self.max_abs_weight_diff:.2g} ({', '.join(self.differing_weights[:3])}"
            f"{' ...' if len(self.differing_weights) > 3 else ''})"
            if self.differing_weights
            else "final weights bit for bit"
        )
        if self.max_abs_loss_diff == 0 and self.differing_weights:
            return f"losses bit for bit; {weights}"
        return f"differs from step {self.first_differing_step}: loss by up to {self.max_abs_loss_diff:.2g}, {weights}"


def _bits(values) -> np.ndarray:
    return np.asarray(values, np.float64).view(np.uint64)  # NaN == NaN, -0.0 != 0.0: the bits themselves


def compare_runs(first: History, repeats: Sequence) -> Repeatability:
    """The first run against each repeat (results with .history and .error), bit for bit."""
    failed = [result.error for result in repeats if result.history is None]
    if failed:
        return Repeatability(1 + len(repeats), False, error=failed[0])
    names = weight_names(first)
    first_steps, loss_diff, weight_diff, differing = [], 0.0, 0.0, set()
    for result in repeats:
        history = result.history
        ours, theirs = _bits(first.step_losses), _bits(history.step_losses)
        if len(ours) != len(theirs):
            first_steps.append(min(len(ours), len(theirs)))
            continue
        steps = np.flatnonzero(ours != theirs)
        if steps.size:
            first_steps.append(int(steps[0]))
            with np.errstate(invalid="ignore"):
                loss_diff = max(
                    loss_diff,
                    float(
                        np.nanmax(
                            np.abs(
                                np.asarray(first.step_losses, np.float64) - np.asarray(history.step_losses, np.float64)
                            )
                        )
                    ),
                )
        these = {
            name
            for name, a, b in zip(names, first.final_weights, history.final_weights)
            if np.asarray(a).dtype != np.asarray(b).dtype or np.asarray(a).tobytes() != np.asarray(b).tobytes()
        }
        if these:
            differing |= these
            weight_diff = max(weight_diff, max_abs_diff(history.final_weights, first.final_weights))
            if not steps.size:
                first_steps.append(len(ours))
    ordered = [name for name in names if name in differing]
    return Repeatability(
        1 + len(repeats),
        not first_steps and not ordered,
        min(first_steps, default=None),
        loss_diff,
        weight_diff,
        ordered,
    )
