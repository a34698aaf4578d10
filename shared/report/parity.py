"""The parity part of what compare.py prints and writes: the table's title, rows and the reasons under it, its
last line, and the JSON report's `parity` and `float64_rerun` entries (shared/judge/verdict.py decides)."""

import dataclasses
from typing import List, Optional

from dtensor_vs_mirrored.shared.config import MIXED_COMPUTE
from dtensor_vs_mirrored.shared.judge.digest import digests
from dtensor_vs_mirrored.shared.judge.mixed import noise_verdict
from dtensor_vs_mirrored.shared.judge.verdict import DIVERGED, FLOAT_NOISE

PARITY_HEADERS = [
    "trainer",
    "max |loss diff|",
    "at step",
    "rel loss diff",
    "max |grad diff|",
    "max |weight diff|",
    "verdict",
]


def parity_rows(run) -> List[list]:
    """One row per trainer with the verdict's keyword; its reason goes under the table (parity_notes)."""
    rows = []
    reference = run.verdicts.get("reference")
    if reference is not None:  # the reference diverged: its own row says so
        rows.append(["reference", "-", "-", "-", "-", "-", reference.verdict])
    elif run.results["reference"].failed:
        rows.append(["reference", "-", "-", "-", "-", "-", "FAILED"])
    for name in run.results:
        if name == "reference":
            continue
        parity = run.parity.get(name)
        if parity is None:
            rows.append([name, "-", "-", "-", "-", "-", "FAILED"])
            continue
        rows.append(
            [
                name,
                f"{parity.max_abs_loss_diff:.2e}",
                parity.loss_diff_step,
                f"{parity.max_rel_loss_diff:.2e}",
                f"{parity.max_abs_grad_diff:.2e}" if parity.gradients_judged else "-",
                f"{parity.max_abs_weight_diff:.2e}",
                run.verdicts[name].verdict,
            ]
        )
    return rows


def parity_notes(run) -> List[str]:
    """Under the parity table, one line per trainer whose verdict has a reason (the JSON has the whole of it)."""
    notes = []
    for name, result in run.results.items():
        verdict = run.verdicts.get(name)
        if verdict is not None and verdict.short_reason():
            notes.append(f"{name:<10} {verdict.short_reason()}")
        elif result.failed or name not in run.parity and name != "reference":
            notes.append(f"{name:<10} {result.error or 'no reference'}")
    return notes


def describe_tolerances(dtype: str, bounds: dict) -> str:
    """e.g. "float32, |diff| <= atol + rtol |reference|: loss 1e-04 + 1e-04, gradients ..., final weights ..."."""
    shown = ", ".join(
        f"{label} {bounds[key][0]:.0e} + {bounds[key][1]:.0e}"
        for key, label in (("loss", "loss"), ("gradient", "gradients"), ("weight", "final weights"))
    )
    return f"{dtype}, |diff| <= atol + rtol |reference|: {shown}"


def parity_title(run) -> str:
    """The parity table's title: the steps and the tolerances judged, and the float64 rerun if there was one."""
    title = "Parity against the single-device reference"
    first = next(iter(run.parity.values()), None)
    if first is not None:
        if run.config.reference_from_scratch:
            title += (
                f" trained from scratch, on the {first.steps} steps after the restore point\n"
                f"(--reference-from-scratch; first-step gradients not compared: the reference's are at "
                f"the initial values)"
            )
        else:
            title += f", all {first.steps} steps"
        title += f"\n{describe_tolerances(first.dtype, first.tolerances)}"
    explained = next((v.float64 for v in run.verdicts.values() if v.float64 is not None), None)
    if explained is not None:
        title += (
            f"\n{first.dtype} failed, so the reference and "
            f"{', '.join(n for n in run.float64_histories if n != 'reference')} "
            f"were rerun in {explained.dtype} ({run.explain_seconds:.1f} s):\n"
            f"{describe_tolerances(explained.dtype, explained.tolerances)}"
        )
    return title


def last_line(run, passed: bool) -> str:
    """PARITY OK or PARITY FAILED, naming the trainers whose float32 (or mixed) difference was float noise (bf16 or
    fp16 noise), or that diverged."""
    kind = noise_verdict(run.config.dtype) if run.config.dtype in MIXED_COMPUTE else FLOAT_NOISE
    noise = [name for name, v in run.verdicts.items() if v.verdict == kind]
    diverged = [name for name, v in run.verdicts.items() if v.verdict == DIVERGED]
    if passed:
        return "PARITY OK" + (f" ({kind}: {', '.join(noise)})" if noise else "")
    return "PARITY FAILED" + (f" (diverged: {', '.join(diverged)})" if diverged else "")


def parity_dict(run) -> dict:
    """JSON `parity.<trainer>`: the run's parity figures, the verdict and its reason, and the float64
    rerun's figures (null without one); `parity.reference` only when the reference diverged. `ok` is the
    verdict's (ok or float noise); `within_tolerance` is the run's own dtype check."""
    report = {}
    for name, verdict in run.verdicts.items():
        entry = dataclasses.asdict(run.parity[name]) if name in run.parity else {}
        entry["within_tolerance"] = entry.pop("ok", False)
        entry["ok"] = verdict.ok
        entry.update({key: value for key, value in dataclasses.asdict(verdict).items() if key != "float64"})
        entry["float64"] = dataclasses.asdict(verdict.float64) if verdict.float64 else None
        report[name] = entry
    return report


def float64_rerun_dict(run) -> Optional[dict]:
    """JSON `float64_rerun`: every float64 run of a float32 run (the explaining rerun's, and those that
    --with-float64 and --baseline trained), with their losses and weight digests; null without one."""
    histories = run.all_float64_histories
    if not histories:
        return None
    return {
        "seconds": run.explain_seconds,
        "more_seconds": run.more_float64_seconds,
        "explained": sorted(run.float64_histories),
        "step_losses": {name: [float(v) for v in history.step_losses] for name, history in histories.items()},
        "final_weights": {name: digests(history) for name, history in histories.items()},
    }
