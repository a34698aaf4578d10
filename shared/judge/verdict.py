"""The verdict on each distributed trainer, and the float64 rerun that explains a float32 failure.

`ok` within the run's tolerances; `float noise` when float32 failed and the reference and this
trainer rerun in float64 from the same start agree; `MISMATCH` when float64 disagrees too (or the
run was float64), naming the first step and what differs there; `diverged` when a loss went NaN
or infinite (no rerun). A mixed run's failure is rerun in float32 (then float64) the same way: `bf16
noise` or `fp16 noise` when it agrees (shared/judge/mixed.py). compare.py exits 0 for ok and the noise
verdicts, 1 otherwise. The rerun costs
about as long as the float32 run of those trainers (docs/parity.md).
"""

import dataclasses
from typing import Dict, List, Optional, Sequence

from dtensor_vs_mirrored.shared.judge.first_difference import FirstDifference
from dtensor_vs_mirrored.shared.judge.mixed import (
    NOISE,
    first_skip_difference,
    left_tolerance,
    noise_verdict,
    rerun_dtype,
    skip_difference,
)
from dtensor_vs_mirrored.shared.judge.parity import (
    Parity,
    check_parity,
    describe_first,
    describe_later,
    first_non_finite_step,
)
from dtensor_vs_mirrored.shared.measure.history import History

OK, FLOAT_NOISE, MISMATCH, DIVERGED = "ok", "float noise", "MISMATCH", "diverged"


@dataclasses.dataclass
class Verdict:
    verdict: str  # OK, FLOAT_NOISE, MISMATCH or DIVERGED
    reason: str = ""  # one line: why
    float32_left_tolerance_step: Optional[int] = None  # the first step beyond the float32 tolerance
    first_disagreeing_step: Optional[int] = None  # MISMATCH: the first step beyond the float64 (or run's) tolerance
    differing: List[str] = dataclasses.field(default_factory=list)  # MISMATCH: what differs at that step
    diverged_step: Optional[int] = None  # this trainer's first non-finite loss step
    float64: Optional[Parity] = None  # the explaining rerun's parity (float32 runs that failed)
    # The reason as printed under the tables, to fit one line: without the figures (the parity table's
    # columns show float32's; the JSON has float64's); "" means the reason itself.
    summary: str = ""
    # MISMATCH: the first tapped value or gradient that differs at the first mismatching step (shared/run/replay.py)
    first_difference: Optional[FirstDifference] = None

    @property
    def ok(self) -> bool:
        return self.verdict in (OK, FLOAT_NOISE, *NOISE.values())

    def line(self) -> str:
        """e.g. "ok", "MISMATCH at step 0: loss; ...", "float noise: float32 left its tolerance at ..."."""
        if not self.reason:
            return self.verdict
        return f"{self.verdict}{' ' if self.reason.startswith('at step') else ': '}{self.reason}"

    def short_reason(self) -> str:
        """What is printed under a table whose row shows the verdict's keyword: "" for ok."""
        return self.summary or self.reason

    def add_reason(self, text: str) -> None:
        """`text` after the reason, and after the printed summary where there is one."""
        self.reason += f"; {text}"
        if self.summary:
            self.summary += f"; {text}"


def diverged(
    history: History,
    step: Optional[int],
    reference_step: Optional[int],
    parity: Optional[Parity],
    is_reference: bool = False,
) -> Verdict:
    """`diverged at step k` for a trainer (or the reference) when its or the reference's loss is not finite."""
    if is_reference:
        return Verdict(DIVERGED, f"at step {step}: loss {_value_at(history, step)}", diverged_step=step)
    if step is None:
        reason = f"the reference diverged at step {reference_step}; this trainer stays finite"
    else:
        reference = (
            "the reference stays finite"
            if reference_step is None
            else f"the reference diverged at step {reference_step}"
        )
        reason = f"at step {step}: loss {_value_at(history, step)} ({reference})"
    end = min(s for s in (step, reference_step) if s is not None)
    if parity is not None and parity.first_loss_step_beyond is not None and parity.first_loss_step_beyond < end:
        reason += f"; the loss left its tolerance before, at step {parity.first_loss_step_beyond}"
    elif end > 0:
        reason += f"; steps 0-{end - 1} agree within the tolerance"
    return Verdict(DIVERGED, reason, diverged_step=step)


def _value_at(history: History, step: int) -> str:
    return f"{history.step_losses[step]}" if step < len(history.step_losses) else "finite, final weights not"


def mismatch(parity: Parity, summarise, note: str = "", short_note: Optional[str] = None) -> Verdict:
    """A real difference: the first step and what differs there (or without a float64 explanation: `note`
    says why; `short_note`, if given, says it in the summary)."""
    first = describe_first(parity.first_step_beyond, parity.differing, parity.state_names, summarise)
    reason = f"at {first}" if first else parity.reason
    later = describe_later(parity.state_first_steps, parity.differing, parity.state_names, summarise)
    if first and later:
        reason += f"; then {later}"
    summary = "" if short_note is None else reason + (f" ({short_note})" if short_note else "")
    return Verdict(
        MISMATCH,
        reason + (f" ({note})" if note else ""),
        float32_left_tolerance_step=parity.first_loss_step_beyond if parity.dtype == "float32" else None,
        first_disagreeing_step=parity.first_step_beyond,
        differing=list(parity.differing),
        summary=summary,
    )


def where_float32_left(parity: Parity, figures: bool = True) -> str:
    """Where a failing float32 check first left its tolerance; with `figures`, by how much (the parity
    table's columns show those, so its summary and the rerun's log line leave them out)."""
    step = parity.first_loss_step_beyond
    if step is not None:
        return f"{left_tolerance(parity.dtype)} left its tolerance at step {step}" + (
            f" (loss diff up to {parity.max_abs_loss_diff:.2g} at step {parity.loss_diff_step}, "
            f"rel {parity.max_rel_loss_diff:.2g})"
            if figures
            else ""
        )
    if "first-step gradients" in parity.differing:
        return f"{left_tolerance(parity.dtype)} left its tolerance in the first-step gradients" + (
            f" (diff {parity.max_abs_grad_diff:.2g})" if figures else ""
        )
    return f"{left_tolerance(parity.dtype)} left its tolerance in the final weights" + (
        f" (diff {parity.max_abs_weight_diff:.2g})" if figures else ""
    )


def explained(float32: Parity, float64: Parity, summarise, between: Optional[Parity] = None) -> Verdict:
    """float noise (bf16 noise, fp16 noise) or MISMATCH, from the wider rerun's parity (`float64`: float32's for a
    mixed run; `between`: a mixed run's float32 rerun that left its tolerance too, before this float64 one)."""
    if float64.ok:
        agrees = f"{float64.dtype} agrees on all {float64.steps} steps"
        if between is not None:
            agrees = f"{where_float32_left(between, figures=False)} too; {agrees}"
        return Verdict(
            noise_verdict(float32.dtype),
            f"{where_float32_left(float32)}; {agrees} "
            f"(max loss diff {float64.max_abs_loss_diff:.2g}, final weights "
            f"{float64.max_abs_weight_diff:.2g})",
            float32_left_tolerance_step=float32.first_loss_step_beyond,
            float64=float64,
            summary=f"{where_float32_left(float32, figures=False)}; {agrees}",
        )
    verdict = mismatch(
        float64,
        summarise,
        f"in {float64.dtype}; {where_float32_left(float32)}",
        f"in {float64.dtype}; {where_float32_left(float32, figures=False)}",
    )
    verdict.float32_left_tolerance_step = float32.first_loss_step_beyond
    verdict.float64 = float64
    return verdict


@dataclasses.dataclass
class Judgement:
    verdicts: Dict[str, Verdict]  # per distributed trainer, and "reference" when it diverged
    # float32 failures that a float64 run of the reference and of them would explain: `explain` decides them
    needs_float64: List[str] = dataclasses.field(default_factory=list)
    float64_histories: Dict[str, History] = dataclasses.field(default_factory=dict)  # those runs', "reference" too
    # A mixed run's: the dtype the trainers in needs_float64 rerun in next (float32, then float64), and each one's
    # float32 rerun parity when that left its tolerance too.
    rerun_dtype: str = "float64"
    between: Dict[str, Parity] = dataclasses.field(default_factory=dict)
    explain_seconds: float = 0.0  # wall time of the float64 rerun; 0 without one


def why_no_rerun(config, no_rerun_reason: str = "") -> str:
    """Why a float32 failure of this run cannot be rerun in float64; "" when it can."""
    if not config.explain:
        return "--no-explain"
    if config.restore:
        return "--restore starts from float32 state, which a float64 rerun cannot restore"
    return no_rerun_reason


def judge(
    config, histories: Dict[str, Optional[History]], parity: Dict[str, Parity], summarise, no_rerun_reason: str = ""
) -> Judgement:
    """Each trainer's verdict from the run's histories ({name: None} for a failed trainer) and parity; a float32
    failure waits in `needs_float64` for `explain`, or is a MISMATCH when it cannot be rerun (`no_rerun_reason`).
    `summarise` groups state names in messages (the model's ModelDefinition.summarise_state)."""
    reference = histories["reference"]
    verdicts: Dict[str, Verdict] = {}
    reference_step = first_non_finite_step(reference) if reference is not None else None
    if reference_step is not None:
        verdicts["reference"] = diverged(reference, reference_step, None, None, is_reference=True)
    failing = []
    for name, check in parity.items():
        own_step = first_non_finite_step(histories[name])
        skips = skip_difference(histories[name].skipped_steps, reference.skipped_steps)
        step_skip = first_skip_difference(histories[name], reference)  # --fit: Keras's loss scaling, step by step
        if step_skip is not None and step_skip[0] <= min(
            s for s in (own_step, reference_step, step_skip[0]) if s is not None
        ):
            verdicts[name] = Verdict(
                MISMATCH, step_skip[1], first_disagreeing_step=step_skip[0], differing=["skipped steps"]
            )
        elif own_step is not None or reference_step is not None:
            verdicts[name] = diverged(histories[name], own_step, reference_step, check)
        elif skips:  # mixed_float16: one decision per step, taken from the combined gradient, as the reference's
            verdicts[name] = Verdict(MISMATCH, skips, differing=["skipped steps"])
        elif check.ok:
            verdicts[name] = Verdict(OK)
        elif rerun_dtype(check.dtype) is None:
            verdicts[name] = mismatch(check, summarise)
        else:
            failing.append(name)
    why_not = why_no_rerun(config, no_rerun_reason)
    if why_not:
        for name in failing:
            verdicts[name] = mismatch(parity[name], summarise, f"float32, not rerun in float64: {why_not}")
        failing = []
    return Judgement(verdicts, failing, rerun_dtype=rerun_dtype(config.dtype) or "float64")


def rerun_line(name: str, parity: Parity, dtype: str = "float64") -> str:
    """What the run logs before it reruns `name` in `dtype` to explain its failure."""
    return f"{name}: {where_float32_left(parity, figures=False)}; rerunning reference and {name} in {dtype} to explain"


def explain(judgement: Judgement, parity: Dict[str, Parity], reruns: Dict, summarise, seconds: float) -> None:
    """Decide every trainer in judgement.needs_float64 from the float64 reruns ({name: a result with .history and
    .error}, "reference" included) that took `seconds`."""
    judgement.explain_seconds = seconds
    judgement.float64_histories = {
        name: result.history for name, result in reruns.items() if result.history is not None
    }
    reference64 = reruns["reference"].history
    wider = []
    for name in judgement.needs_float64:
        judgement.verdicts[name] = explain_one(
            parity[name], reruns[name], reference64, reruns["reference"].error, summarise, judgement.between.get(name)
        )
        rerun = judgement.verdicts[name].float64
        if judgement.rerun_dtype == "float32" and rerun is not None and not rerun.ok:  # float32 noisy itself
            judgement.between[name] = rerun
            wider.append(name)
    judgement.needs_float64 = wider
    judgement.rerun_dtype = "float64"


def explain_one(
    float32: Parity,
    rerun_result,
    reference64: Optional[History],
    reference_error: str,
    summarise,
    between: Optional[Parity] = None,
) -> Verdict:
    """The verdict on one trainer from its float64 rerun (a result with .history and .error)."""
    wider = "float64" if between is not None else rerun_dtype(float32.dtype)
    if reference64 is None or rerun_result.history is None:
        error = reference_error if reference64 is None else rerun_result.error
        return mismatch(float32, summarise, f"{float32.dtype}; the {wider} rerun failed: {error}")
    float64 = check_parity(rerun_result.history, reference64)
    for history in (rerun_result.history, reference64):
        step = first_non_finite_step(history)
        if step is not None:
            return mismatch(
                float32, summarise, f"{float32.dtype}; the {wider} rerun of {history.trainer} diverged at step {step}"
            )
    return explained(float32, float64, summarise, between)


def names_of(verdicts: Dict[str, Verdict], verdict: str) -> Sequence[str]:
    return [name for name, v in verdicts.items() if v.verdict == verdict]


def passed(run, sweep) -> bool:
    """The verdict: every trainer finished and matched the reference, in the main run and the sweep."""
    return bool(run.ok and all(entry.ok for entry in sweep))


def exit_ok(run, sweep) -> bool:
    """Exit 0: parity holds, and no trainer CHANGED against --baseline."""
    return passed(run, sweep) and (run.baseline is None or run.baseline.ok)
