"""Parity: does a distributed trainer compute the same training run as the reference?

Every value is judged as numpy.isclose does, |candidate - reference| <= atol + rtol *
|reference|, element by element: the loss of every training step, the first step's
gradients (at the initial weights), the final weights, and in float64 runs the
checksums of every weight, bias and Adam slot after every step (shared/measure/checksums.py),
which name the first step and the variables that differ. One bound per dtype
(DEFAULT_TOLERANCE; TOLERANCES per quantity), measured on every mesh and replica count
in docs/parity.md: above the float noise seen there, far below the smallest real
difference. Every step is judged, however long the run: float32 noise compounds
through Adam, and what tells it from a bug is the float64 rerun (shared/judge/verdict.py),
not a window of early steps.
"""

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dtensor_vs_mirrored.shared.judge.bounds import FLOAT_TOLERANCE
from dtensor_vs_mirrored.shared.judge.mixed import MIXED_TOLERANCE
from dtensor_vs_mirrored.shared.measure.history import History


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float

    def bound(self, reference) -> np.ndarray:
        return self.atol + self.rtol * np.abs(np.asarray(reference, np.float64))


DEFAULT_TOLERANCE = {**FLOAT_TOLERANCE, **MIXED_TOLERANCE}  # the floats' (judge/bounds.py), mixed: 4 epsilon (mixed.py)
WEIGHT_TOLERANCE_FACTOR = 10


def tolerances(dtype: str, override: Optional[float] = None) -> Dict[str, Tolerance]:
    """The (atol, rtol) per quantity for `dtype`, from DEFAULT_TOLERANCE[dtype] or --tolerance T."""
    bound = DEFAULT_TOLERANCE[dtype] if override is None else override
    weight = WEIGHT_TOLERANCE_FACTOR * bound
    return {
        "loss": Tolerance(bound, bound),
        "gradient": Tolerance(bound, bound),
        "weight": Tolerance(weight, weight),
        "state": Tolerance(0.0, bound),
    }  # atol per variable: state_atol


TOLERANCES = {dtype: tolerances(dtype) for dtype in DEFAULT_TOLERANCE}


@dataclasses.dataclass
class Parity:
    dtype: str
    steps: int  # steps judged: every step both runs have
    max_abs_loss_diff: float
    loss_diff_step: int  # 0-based training step of the largest loss difference
    max_rel_loss_diff: float  # largest |loss diff| / |reference loss|
    max_abs_grad_diff: float  # NaN when not judged
    max_abs_weight_diff: float
    tolerances: Dict[str, Tuple[float, float]]  # quantity -> (atol, rtol)
    ok: bool
    reason: str = ""  # why not ok, in one line
    first_loss_step_beyond: Optional[int] = None  # first step whose loss left its bound
    # The first step at which anything left its bound: its loss, (step 0) the initial state and the
    # gradients, or the state after its update (shared/measure/checksums.py). None when no step did.
    first_step_beyond: Optional[int] = None
    differing: List[str] = dataclasses.field(default_factory=list)  # what left its bound at that step
    state_judged: bool = False  # both runs recorded state checksums (float64)
    state_names: List[str] = dataclasses.field(default_factory=list)  # every state variable, for messages
    # Per state variable that left its bound: the step whose update first made it differ (-1: the initial state).
    state_first_steps: Dict[str, int] = dataclasses.field(default_factory=dict)
    # False when the reference has no first-step gradients to compare: --reference-from-scratch, whose
    # reference computed its gradients at the initial values, not at the restore point.
    gradients_judged: bool = True


def max_abs_diff(arrays, reference_arrays) -> float:
    """Largest |a - b| over paired arrays (in float64, so the difference itself is exact); 0 for none."""
    return max(
        (
            float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
            for a, b in zip(arrays, reference_arrays)
            if np.size(a)
        ),
        default=0.0,
    )


def beyond(values, reference_values, tolerance: Tolerance) -> np.ndarray:
    """Elementwise: does |value - reference| exceed atol + rtol |reference|? NaN and inf always do."""
    values, reference_values = np.asarray(values, np.float64), np.asarray(reference_values, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        within = np.abs(values - reference_values) <= tolerance.bound(reference_values)
    return ~within


def arrays_beyond(arrays, reference_arrays, tolerance: Tolerance) -> bool:
    return any(np.any(beyond(a, b, tolerance)) for a, b in zip(arrays, reference_arrays))


def first_non_finite_step(history: History) -> Optional[int]:
    """The first step whose loss is NaN or infinite; len(steps) if only the final weights are; else None."""
    losses = np.asarray(history.step_losses, np.float64)
    bad = np.flatnonzero(~np.isfinite(losses))
    if bad.size:
        return int(bad[0])
    if any(not np.all(np.isfinite(w)) for w in history.final_weights):
        return len(losses)
    return None


# How a model groups state names in messages: ModelDefinition.summarise_state (shared/model/definition.py).
Summarise = Callable[[Sequence[str], Sequence[str]], str]

PRE_UPDATE = ("loss", "first-step gradients")  # what a step computes from the state it starts from
INITIAL = "initial "  # prefixes a state name in `differing` when the initial state differs


def first_step_beyond(
    loss_beyond: np.ndarray, grads_beyond: bool, state_beyond: Optional[np.ndarray], state_names: Sequence[str]
) -> Tuple[Optional[int], List[str]]:
    """(step, what) of the first step at which a value left its bound, and every value of that step that did.

    state_beyond[s] judges the state step s starts from (the last entry: the final state). Step s
    computes its loss (and at step 0 the gradients) from state s and updates it to state s + 1,
    so a step's differences are its loss, gradients and state s + 1; step 0's also state 0.
    """

    def rows(entry):
        if state_beyond is None or entry >= len(state_beyond):
            return []
        return [state_names[row] for row in np.flatnonzero(state_beyond[entry])]

    for step in range(len(loss_beyond)):
        initial = [INITIAL + name for name in rows(0)] if step == 0 else []
        before = [name for name, out in zip(PRE_UPDATE, (loss_beyond[step], step == 0 and grads_beyond)) if out]
        after = [name for name in rows(step + 1) if INITIAL + name not in initial]  # new differences only
        if initial or before or after:
            return step, initial + before + after
    return None, []


def describe_later(
    state_first_steps: Dict[str, int], differing: Sequence[str], all_names: Sequence[str], summarise: Summarise
) -> str:
    """The state variables that differ only after later steps, grouped by that step: "every Adam slot from step 1"."""
    shown = {name[len(INITIAL) :] if name.startswith(INITIAL) else name for name in differing}
    by_step = {}
    for name, step in state_first_steps.items():
        if name not in shown:
            by_step.setdefault(step, []).append(name)
    return "; ".join(f"{summarise(names, all_names)} from step {step}" for step, names in sorted(by_step.items()))


def describe_first(
    step: Optional[int], differing: Sequence[str], all_names: Sequence[str], summarise: Summarise
) -> str:
    """e.g. "step 0: loss, first-step gradients; after its update every weight, bias and Adam slot"."""
    if step is None:
        return ""
    initial = [name[len(INITIAL) :] for name in differing if name.startswith(INITIAL)]
    before = [name for name in differing if name in PRE_UPDATE]
    after = [name for name in differing if name not in PRE_UPDATE and not name.startswith(INITIAL)]
    parts = (
        (["initial state " + summarise(initial, all_names)] if initial else [])
        + ([", ".join(before)] if before else [])
        + (["after its update " + summarise(after, all_names)] if after else [])
    )
    return f"step {step}: " + "; ".join(parts)


# Measured (ViT, float64, 32 steps): the key biases' noise against their kind's scale reached 5e-15 per
# element, other variables' differences 2e-14: the floor, 1e-10 at float64's T, is 2e4 above them.
STATE_NOISE_FRACTION = 1e-3


def state_kind(name: str) -> str:
    return name[-6:] if name.endswith((" Adam m", " Adam v")) else "variable"


def state_atol(checksums: np.ndarray, names: Sequence[str], sizes: Sequence[int], bound: float):
    """[entries, rows] absolute bounds for the state checksums (sum |x| per variable): STATE_NOISE_FRACTION
    x `bound` x the variable's size x the largest mean |x| among the variables of its kind (weights, Adam
    m, Adam v) at that entry. A variable whose values are rounding noise beside its kind's (a gradient
    that is zero in exact arithmetic, as a key bias's in attention or a bias before batch normalisation)
    is not judged on its noise; any other keeps a bound ~1e-3 x bound of its kind's scale. 0 without
    sizes (histories from before they were recorded)."""
    if len(sizes) != len(names):
        return 0.0
    sizes = np.asarray(sizes, np.float64)
    means = checksums / np.maximum(sizes, 1)
    scale = np.zeros_like(checksums)
    for kind in {state_kind(name) for name in names}:
        rows = [row for row, name in enumerate(names) if state_kind(name) == kind]
        scale[:, rows] = means[:, rows].max(axis=1, keepdims=True)
    return STATE_NOISE_FRACTION * bound * sizes * scale


def check_parity(candidate: History, reference: History, tolerance: Optional[float] = None) -> Parity:
    """Judge `candidate` against `reference` (same dtype) with TOLERANCES[dtype], or --tolerance T."""
    bounds = tolerances(reference.dtype, tolerance)
    losses, reference_losses = (np.asarray(h.step_losses, np.float64) for h in (candidate, reference))
    reasons = []
    if candidate.dtype != reference.dtype:
        reasons.append(f"{candidate.dtype} run, reference is {reference.dtype}")
    if len(losses) != len(reference_losses):
        reasons.append(f"{len(losses)} steps, reference has {len(reference_losses)}")
    steps = min(len(losses), len(reference_losses))
    loss = _loss_figures(losses[:steps], reference_losses[:steps], bounds["loss"])
    same_shapes = [np.shape(a) for a in candidate.final_weights] == [np.shape(a) for a in reference.final_weights]
    if not same_shapes:
        reasons.append("final weight shapes differ from the reference's")
    gradients_judged = bool(reference.first_step_gradients)
    if gradients_judged and len(candidate.first_step_gradients) != len(reference.first_step_gradients):
        count, expected = len(candidate.first_step_gradients), len(reference.first_step_gradients)
        reasons.append(f"{count} first-step gradients, reference has {expected}")
    grads_beyond = arrays_beyond(candidate.first_step_gradients, reference.first_step_gradients, bounds["gradient"])
    weights_beyond = same_shapes and arrays_beyond(candidate.final_weights, reference.final_weights, bounds["weight"])
    state_beyond = _state_beyond(candidate, reference, bounds["state"])
    first_step, differing = first_step_beyond(loss.beyond, grads_beyond, state_beyond, reference.state_names)
    reasons += _reasons(candidate, reference, loss, grads_beyond, state_beyond, weights_beyond, first_step, steps)
    return Parity(
        dtype=reference.dtype,
        steps=steps,
        max_abs_loss_diff=loss.max_diff,
        loss_diff_step=loss.worst_step,
        max_rel_loss_diff=loss.max_relative,
        max_abs_grad_diff=max_abs_diff(candidate.first_step_gradients, reference.first_step_gradients)
        if gradients_judged
        else float("nan"),
        max_abs_weight_diff=max_abs_diff(candidate.final_weights, reference.final_weights)
        if same_shapes
        else float("nan"),
        tolerances={name: (bound.atol, bound.rtol) for name, bound in bounds.items()},
        ok=not reasons,
        reason="; ".join(reasons),
        first_loss_step_beyond=loss.first_beyond,
        first_step_beyond=first_step,
        differing=differing,
        state_judged=state_beyond is not None,
        state_names=list(reference.state_names) if state_beyond is not None else [],
        state_first_steps=_state_first_steps(state_beyond, reference.state_names),
        gradients_judged=gradients_judged,
    )


@dataclasses.dataclass(frozen=True)
class _LossFigures:
    beyond: np.ndarray  # per step: left its bound
    worst_step: int  # of the largest difference (the first NaN's, if any)
    max_diff: float
    max_relative: float
    first_beyond: Optional[int]  # the first step that left its bound; None when none did


def _loss_figures(losses: np.ndarray, reference_losses: np.ndarray, bound: Tolerance) -> _LossFigures:
    steps = len(losses)
    with np.errstate(invalid="ignore", divide="ignore"):
        loss_diffs = np.abs(losses - reference_losses)
        relative = loss_diffs / np.abs(reference_losses)
    loss_beyond = beyond(losses, reference_losses, bound)
    if np.any(np.isnan(loss_diffs)):
        worst_step, max_loss = int(np.flatnonzero(np.isnan(loss_diffs))[0]), float("nan")
    else:
        worst_step = int(np.argmax(loss_diffs)) if steps else 0
        max_loss = float(loss_diffs[worst_step]) if steps else 0.0
    max_relative = float(np.nanmax(relative)) if steps and not np.all(np.isnan(relative)) else 0.0
    first = int(np.flatnonzero(loss_beyond)[0]) if np.any(loss_beyond) else None
    return _LossFigures(loss_beyond, worst_step, max_loss, max_relative, first)


def _state_beyond(candidate: History, reference: History, bound: Tolerance) -> Optional[np.ndarray]:
    """[entries, variables]: which state checksums left their bound; None when the state is not judged (not both
    float64 runs with the same state)."""
    if not (
        candidate.step_state_checksums
        and reference.step_state_checksums
        and candidate.state_names == reference.state_names
    ):
        return None
    entries = min(len(candidate.step_state_checksums), len(reference.step_state_checksums))
    references = np.asarray(reference.step_state_checksums[:entries], np.float64)
    atol = state_atol(references, reference.state_names, reference.state_sizes, bound.rtol)
    return beyond(candidate.step_state_checksums[:entries], references, dataclasses.replace(bound, atol=atol))


def _state_first_steps(state_beyond: Optional[np.ndarray], names) -> Dict[str, int]:
    """Per state variable that left its bound: the step whose update first made it differ (-1: the initial state)."""
    if state_beyond is None:
        return {}
    found = {}
    for row, name in enumerate(names):
        entries = np.flatnonzero(state_beyond[:, row])
        if entries.size:
            found[name] = int(entries[0]) - 1
    return found


def _reasons(candidate, reference, loss, grads_beyond, state_beyond, weights_beyond, first_step, steps) -> List[str]:
    """What left its bound, in one phrase each, in the order the reason line gives them."""
    reasons = []
    if loss.first_beyond is not None:
        reasons.append(
            f"loss differs from step {loss.first_beyond} on (by up to {loss.max_diff:.3g} at step {loss.worst_step}, "
            f"rel {loss.max_relative:.2g})"
        )
    if grads_beyond:
        reasons.append(
            "first-step gradients differ by "
            f"{max_abs_diff(candidate.first_step_gradients, reference.first_step_gradients):.3g}"
        )
    state_differs = state_beyond is not None and bool(np.any(state_beyond))
    if state_differs and loss.first_beyond is None:
        reasons.append(f"state differs from step {first_step} on")
    if steps == 0 and state_differs:
        reasons.append("state differs")
    if weights_beyond:
        reasons.append(f"final weights differ by {max_abs_diff(candidate.final_weights, reference.final_weights):.3g}")
    return reasons
