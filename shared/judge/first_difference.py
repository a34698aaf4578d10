"""Where a MISMATCH starts in the forward: the first tapped value, then the first tapped gradient, that differs.

The replay (shared/run/replay.py) runs the first mismatching step on the reference and on the trainer, in
float64, from the same state, and each records every value its forward tapped (ForwardContext.tap) and the
loss's gradient with respect to it. Values are compared in forward order, then gradients in backward order
(the last tap's first), each with the float64 gradient tolerance; the first beyond it is named, with the
taps before it that agree. A DTensor's zero units (a width padded to divide) are cut to the reference's shape.
"""

import dataclasses
from typing import List, Optional

import numpy as np

from dtensor_vs_mirrored.shared.judge.parity import Tolerance, beyond
from dtensor_vs_mirrored.shared.measure.taps import Taps

AGREED_SHOWN = 3  # taps named before "... and N more"


@dataclasses.dataclass
class FirstDifference:
    step: int  # the training step replayed (0-based)
    tap: str  # the first tap that differs; "" when every tap agrees
    phase: str  # "forward" (its value) or "backward" (its gradient); "" when none differs
    max_abs_diff: float  # at that tap; 0 when none differs
    agreed: List[str]  # the taps compared before it that agree, in the order compared
    seconds: float = 0.0  # the replay's wall time
    note: str = ""  # why nothing could be named (no taps, the replay failed)

    def line(self) -> str:
        """e.g. "first difference at step 0: norm/output (forward) by 0.83; agreed before it: dense"."""
        if self.note:
            return f"first difference not located at step {self.step}: {self.note}"
        if not self.tap:
            return (
                f"every tap agrees at step {self.step}, forward and backward: the difference is outside the taps "
                f"(the loss, the update, or an untapped layer)"
            )
        shown = self.agreed[-AGREED_SHOWN:]
        before = (f"... {len(self.agreed) - len(shown)} more, " if len(self.agreed) > len(shown) else "") + ", ".join(
            shown
        )
        return f"first difference at step {self.step}: {self.tap} ({self.phase}) by {self.max_abs_diff:.3g}" + (
            f"; agreed before it: {before}" if self.agreed else "; nothing tapped before it"
        )


def aligned(candidate: np.ndarray, reference: np.ndarray) -> Optional[np.ndarray]:
    """`candidate` cut to the reference's shape where it is larger (zero units); None when it cannot be."""
    candidate, reference = np.asarray(candidate), np.asarray(reference)
    if candidate.ndim != reference.ndim or any(c < r for c, r in zip(candidate.shape, reference.shape)):
        return None
    return candidate[tuple(slice(0, size) for size in reference.shape)]


def locate(candidate: Taps, reference: Taps, tolerance: Tolerance, seconds: float = 0.0) -> FirstDifference:
    """The first tap whose value (forward order), then gradient (backward order), differs beyond `tolerance`."""
    step = reference.step
    if not reference.names:
        return FirstDifference(step, "", "", 0.0, [], seconds, "the forward taps nothing (ForwardContext.tap)")
    found = dict(zip(candidate.names, zip(candidate.values, candidate.gradients)))
    agreed: List[str] = []
    order = [(name, "forward", 0) for name in reference.names] + [
        (name, "backward", 1) for name in reversed(reference.names)
    ]
    reference_taps = dict(zip(reference.names, zip(reference.values, reference.gradients)))
    for name, phase, part in order:
        want = reference_taps[name][part]
        label = name if phase == "forward" else f"{name} gradient"
        if name not in found:
            return FirstDifference(step, name, phase, float("nan"), agreed, seconds, f"{name} is not tapped there")
        have = found[name][part]
        if want is None and have is None:
            continue
        if want is None or have is None:
            return FirstDifference(step, name, phase, float("nan"), agreed, seconds)
        cut = aligned(have, want)
        if cut is None:
            return FirstDifference(
                step,
                name,
                phase,
                float("nan"),
                agreed,
                seconds,
                f"{label} has shape {list(np.shape(have))}, the reference's {list(np.shape(want))} "
                f"(a tap's first axis must be the examples)",
            )
        if np.any(beyond(cut, want, tolerance)):
            difference = float(np.max(np.abs(np.asarray(cut, np.float64) - np.asarray(want, np.float64))))
            return FirstDifference(step, name, phase, difference, agreed, seconds)
        agreed.append(label)
    return FirstDifference(step, "", "", 0.0, agreed, seconds)
