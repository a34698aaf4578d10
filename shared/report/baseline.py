"""--baseline's part of what compare.py prints and writes: its table, its last line and the JSON's `baseline`
(shared/judge/baseline.py decides)."""

import dataclasses
from typing import List, Optional

from dtensor_vs_mirrored.shared.judge.baseline import CHANGED, FLOAT_NOISE, SAME, BaselineResult

BASELINE_HEADERS = [
    "trainer",
    "max |loss diff|",
    "at step",
    "max |weight sample diff|",
    "max rel weight sum diff",
    "verdict",
]


def title(result: BaselineResult) -> str:
    environment, config = result.report["environment"], result.report["config"]
    devices, bounds = environment.get("devices") or [], result.bounds
    return (
        f"Against the baseline {result.path} (TensorFlow {environment.get('tensorflow')}"
        + (f", Keras {environment['keras']}" if environment.get("keras") else "")
        + f", {len(devices)} devices, "
        f"mesh {config.get('mesh') or 'batch=' + str(len(devices))}): every step's loss and the final weights' "
        f"samples and sums ({config.get('dtype')}, |diff| <= atol + rtol |baseline|: loss {bounds['loss'].atol:.0e} "
        f"+ {bounds['loss'].rtol:.0e}, weight samples {bounds['weight'].atol:.0e} + {bounds['weight'].rtol:.0e}; "
        f"sums rel {bounds['state'].rtol:.0e})"
    )


def rows(result: BaselineResult) -> List[list]:
    table = []
    for name, verdict in result.verdicts.items():
        found = verdict.difference
        figures = (
            ["-"] * 4
            if found is None
            else [
                f"{found.max_abs_loss_diff:.2e}",
                found.loss_diff_step,
                f"{found.max_abs_weight_sample_diff:.2e}",
                f"{found.max_rel_weight_sum_diff:.2e}",
            ]
        )
        table.append([name, *figures, verdict.line()])
    return table


def last_line(result: BaselineResult) -> str:
    """BASELINE SAME (bit for bit), BASELINE SAME (float noise: reference) or BASELINE CHANGED (dtensor)."""
    by_verdict = {
        kind: [name for name, v in result.verdicts.items() if v.verdict == kind]
        for kind in (SAME, FLOAT_NOISE, CHANGED)
    }
    if by_verdict[CHANGED]:
        return f"BASELINE CHANGED ({', '.join(by_verdict[CHANGED])})"
    if by_verdict[FLOAT_NOISE]:
        return f"BASELINE SAME (float noise: {', '.join(by_verdict[FLOAT_NOISE])})"
    compared = [v for v in result.verdicts.values() if v.verdict == SAME]
    return "BASELINE SAME" + (
        " (bit for bit)" if compared and all(v.difference.bitwise_identical for v in compared) else ""
    )


def baseline_dict(result: Optional[BaselineResult]) -> Optional[dict]:
    """JSON `baseline`: what was compared with, and per trainer the verdict and its figures; null without one."""
    if result is None:
        return None
    environment = result.report["environment"]
    return {
        "path": result.path,
        "schema_version": result.report["schema_version"],
        "tensorflow": environment.get("tensorflow"),
        "keras": environment.get("keras"),  # null in a baseline written before 2.5
        "devices": environment.get("devices"),
        "ok": result.ok,
        "tolerances": {name: [bound.atol, bound.rtol] for name, bound in result.bounds.items()},
        "trainers": {
            name: {
                "verdict": verdict.verdict,
                "reason": verdict.reason,
                "line": verdict.line(),
                "first_changed_step": verdict.first_changed_step,
                "bitwise_identical": bool(verdict.difference and verdict.difference.bitwise_identical),
                "difference": verdict.difference and dataclasses.asdict(verdict.difference),
                "float64": verdict.float64 and dataclasses.asdict(verdict.float64),
            }
            for name, verdict in result.verdicts.items()
        },
    }
