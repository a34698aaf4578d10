"""--baseline REPORT.json: this run against a report saved on another machine, TensorFlow release or commit.

    python compare.py --dtype float64 --data embedded --json a.json      # save one
    python compare.py --dtype float64 --data embedded --baseline a.json  # later, elsewhere: exit 1 if CHANGED

Every trainer is judged on every step's loss and its final weights (their digests, shared/judge/digest.py)
at this run's tolerances: `same` (bit for bit when every loss and weight byte is equal), `float noise`
(a float32 difference whose float64 runs agree) or `CHANGED at step k`. A file that is not a report
of this schema's major version, or whose run differs in an option that changes the numbers
(NUMERIC_OPTIONS below, and the data), is refused in one line. Docs: docs/baselines.md.
"""

import dataclasses
from typing import Dict, List, Optional, Sequence

import numpy as np

from dtensor_vs_mirrored.shared.config import TUTORIAL_HIDDEN, Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.judge.digest import SUMS, digests, same_bytes
from dtensor_vs_mirrored.shared.judge.parity import Tolerance, beyond, tolerances
from dtensor_vs_mirrored.shared.measure.history import History

SAME, FLOAT_NOISE, CHANGED, NOT_COMPARED = "same", "float noise", "CHANGED", "not compared"
SAVE_FLOAT64 = "save the baseline with --with-float64"
# The options that change the numbers a run computes: a --baseline report must have the same, and the same data
# (its sha256). Devices, mesh, clients, --dtensor-input, --mirrored-update and --deterministic change only which
# kernels run and the order of roundings, which is what the comparison judges; they may differ.
NUMERIC_OPTIONS = (
    "model",
    "epochs",
    "batch_size",
    "learning_rate",
    "seed",
    "optimizer",
    "adam",
    "dtype",
    "hidden",
    "dropout",
    "shuffle",
    "restore",
    "clip_global_norm",
    "fit",
)


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _shown(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _comparable(value):
    return tuple(value) if isinstance(value, list) else value


def option_value(name: str, value):
    """A model option as a run takes it: --hidden's default (None) is the tutorial's 700,500, as reports
    from before --model recorded it."""
    return list(TUTORIAL_HIDDEN) if name == "hidden" and value is None else value


def check_options(report: dict, config: Config, data, data_sha256: str, path: str) -> None:
    """Refuse a baseline whose run would compute other numbers: one line naming every differing option."""
    recorded, environment = report["config"], report["environment"]
    saved = [name for name, entry in report["trainers"].items() if not entry.get("failed")]
    ran = {"reference", *(saved if config.trainers is None else config.trainers)}  # None: every trainer (registry)
    if not set(saved) & ran:
        raise UsageError(
            f"--baseline {path}: holds none of this run's trainers (it has "
            f"{', '.join(report['trainers']) or 'none'}); save a baseline of them"
        )
    defaults, current = dataclasses.asdict(Config()), dataclasses.asdict(config)
    saved_values = {name: option_value(name, recorded.get(name, defaults[name])) for name in NUMERIC_OPTIONS}
    current = {name: option_value(name, current[name]) for name in NUMERIC_OPTIONS}
    differing = [
        f"{_flag(name)} {_shown(saved_values[name])} (this run {_shown(current[name])})"
        for name in NUMERIC_OPTIONS
        if _comparable(saved_values[name]) != _comparable(current[name])
    ]
    counts = [("train_examples", len(data.y_train)), ("test_examples", len(data.y_test))]
    other_counts = [
        f"{_flag(name)} {environment.get(name)} (this run {count})"
        for name, count in counts
        if environment.get(name) != count
    ]
    differing += other_counts
    if not other_counts and environment.get("data_sha256") != data_sha256:
        differing.append(f"--data {environment.get('data_source')} (this run {data.source}: other images or labels)")
    if differing:
        raise UsageError(
            f"--baseline {path}: its run differs in options that change the numbers: "
            f"{'; '.join(differing)}; run with the baseline's values or save a new baseline"
        )


@dataclasses.dataclass
class Difference:
    """One trainer's run against a baseline run of it, at one dtype's tolerances."""

    dtype: str
    steps: int
    bitwise_identical: bool
    max_abs_loss_diff: float
    loss_diff_step: int
    first_loss_step_beyond: Optional[int]  # None: every loss within its bound
    max_abs_weight_sample_diff: float
    max_rel_weight_sum_diff: float  # over sum, sum |x|, sum x**2 of every array, relative to sum |x| or sum x**2
    weights_beyond: List[str]  # the arrays whose digest left its bound
    reason: str = ""  # why not within, one line: "at step 12: loss ..." or "in the final weights: ..."

    @property
    def within(self) -> bool:
        return not self.reason


def _floats(values) -> np.ndarray:
    """JSON numbers as float64, null (NaN or infinity when written) as NaN."""
    return np.array([np.nan if value is None else value for value in values], np.float64)


def _sum_scale(digest: dict, key: str) -> float:
    """What a sum's difference is relative to: sum |x| bounds both sum and sum |x|; sum x**2 itself."""
    return abs(digest["sum_squares" if key == "sum_squares" else "sum_abs"] or 0.0)


def compare(
    losses: Sequence[float],
    weight_digests: Sequence[dict],
    baseline_losses: Sequence[Optional[float]],
    baseline_digests: Sequence[dict],
    bounds: Dict[str, Tolerance],
    dtype: str,
) -> Difference:
    """Every step's loss (as shared/judge/parity.py judges it) and each weight array's digest: its samples at the
    weight tolerance, its sums relatively at the state tolerance (as shared/measure/checksums.py's are judged)."""
    ours, theirs = _floats(losses), _floats(baseline_losses)
    steps = min(len(ours), len(theirs))
    both_nan = np.isnan(ours[:steps]) & np.isnan(theirs[:steps])
    loss_beyond = beyond(ours[:steps], theirs[:steps], bounds["loss"]) & ~both_nan
    with np.errstate(invalid="ignore"):
        diffs = np.where(both_nan, 0.0, np.abs(ours[:steps] - theirs[:steps]))
    worst = int(np.nanargmax(diffs)) if steps and not np.all(np.isnan(diffs)) else 0
    max_loss = float(diffs[worst]) if steps else 0.0
    first_loss = int(np.flatnonzero(loss_beyond)[0]) if np.any(loss_beyond) else None
    weights_beyond, max_sample, max_sum = _weights_beyond(weight_digests, baseline_digests, bounds)
    identical = (
        len(ours) == len(theirs)
        and bool(np.all((ours == theirs) | (np.isnan(ours) & np.isnan(theirs))))
        and same_bytes(weight_digests, baseline_digests)
    )
    if len(ours) != len(theirs):
        reason = f"{len(ours)} steps, the baseline has {len(theirs)}"
    elif first_loss is not None:
        reason = (
            f"at step {first_loss}: loss {ours[first_loss]:.8g}, baseline {theirs[first_loss]:.8g} "
            f"(diff {diffs[first_loss]:.2g})"
            + (f"; up to {max_loss:.2g} at step {worst}" if worst != first_loss else "")
        )
    elif weights_beyond:
        reason = (
            f"in the final weights: {', '.join(weights_beyond[:3])}{' ...' if len(weights_beyond) > 3 else ''} "
            f"(samples up to {max_sample:.2g} apart, sums rel {max_sum:.2g})"
        )
    else:
        reason = ""
    return Difference(dtype, steps, identical, max_loss, worst, first_loss, max_sample, max_sum, weights_beyond, reason)


def _weights_beyond(weight_digests, baseline_digests, bounds: Dict[str, Tolerance]):
    """(the arrays whose digest left its bound, the largest sample difference, the largest relative sum
    difference): samples at the weight tolerance, sums relatively at the state tolerance."""
    weights_beyond, max_sample, max_sum = [], 0.0, 0.0
    for ours_digest, theirs_digest in zip(weight_digests, baseline_digests):
        if ours_digest["shape"] != theirs_digest["shape"]:
            weights_beyond.append(
                f"{ours_digest['name']} (shape {ours_digest['shape']}, baseline {theirs_digest['shape']})"
            )
            continue
        out = False
        if ours_digest["sample_indices"] == theirs_digest["sample_indices"]:  # else another SAMPLE_COUNT: sums only
            samples = _floats(ours_digest["sample_values"]), _floats(theirs_digest["sample_values"])
            out = bool(np.any(beyond(*samples, bounds["weight"])))
            if samples[0].size:
                max_sample = max(max_sample, float(np.nanmax(np.abs(samples[0] - samples[1]), initial=0.0)))
        for key in SUMS:
            a, b = ours_digest[key], theirs_digest[key]
            if a is None or b is None:  # not finite (JSON null)
                out = out or a != b
                continue
            scale = _sum_scale(theirs_digest, key)
            relative = abs(a - b) / scale if scale else float(a != b)
            max_sum = max(max_sum, relative)
            out = out or relative > bounds["state"].rtol
        if out:
            weights_beyond.append(ours_digest["name"])
    if len(weight_digests) != len(baseline_digests):
        weights_beyond.append(f"{len(weight_digests)} weight arrays, baseline has {len(baseline_digests)}")
    return weights_beyond, max_sample, max_sum


@dataclasses.dataclass
class BaselineVerdict:
    verdict: str  # SAME, FLOAT_NOISE, CHANGED or NOT_COMPARED
    reason: str = ""
    difference: Optional[Difference] = None  # this run's dtype
    float64: Optional[Difference] = None  # the float64 runs', when float32 left its tolerance and both had one

    @property
    def ok(self) -> bool:
        return self.verdict != CHANGED

    @property
    def first_changed_step(self) -> Optional[int]:
        """CHANGED: the first step whose loss left its bound; the step count when only the final weights did."""
        decisive = self.float64 or self.difference
        if self.verdict != CHANGED or decisive is None:
            return None
        return decisive.steps if decisive.first_loss_step_beyond is None else decisive.first_loss_step_beyond

    def line(self) -> str:
        """e.g. "same (bit for bit)", "CHANGED at step 12: loss ...", "float noise: float32 left ..."."""
        if self.verdict == SAME:
            return f"{SAME} ({self.reason})" if self.reason else SAME
        if not self.reason:
            return self.verdict
        return f"{self.verdict}{' ' if self.reason.startswith(('at step', 'in the')) else ': '}{self.reason}"


@dataclasses.dataclass
class BaselineResult:
    path: str
    report: dict  # the baseline, as loaded
    verdicts: Dict[str, Optional[BaselineVerdict]]  # None while pending
    bounds: Dict[str, Tolerance]  # this run's dtype
    pending: Dict[str, "Difference"] = dataclasses.field(default_factory=dict)  # float32 differences to explain

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts.values())


def where_float32_left(difference: Difference) -> str:
    if difference.first_loss_step_beyond is not None:
        return (
            f"float32 left its tolerance at step {difference.first_loss_step_beyond} (loss diff up to "
            f"{difference.max_abs_loss_diff:.2g} at step {difference.loss_diff_step})"
        )
    return f"float32 left its tolerance {difference.reason}"


def baseline_float64(report: dict, name: str):
    """(step losses, weight digests) of the baseline's float64 run of `name`, or None."""
    record = report.get("float64_rerun") or {}
    losses, weights = (record.get(key, {}).get(name) for key in ("step_losses", "final_weights"))
    return None if losses is None or weights is None else (losses, weights)


def judge(
    histories: Dict[str, Optional[History]], report: dict, path: str, dtype: str, tolerance=None
) -> BaselineResult:
    """Each trainer's verdict against `report`, from this run's histories ({name: None} for a failed trainer).
    A float32 difference stays pending (`BaselineResult.pending`) until `explain` gets the float64 runs."""
    bounds = tolerances(dtype, tolerance)
    result = BaselineResult(path, report, {}, bounds)
    for name, history in histories.items():
        saved = report["trainers"].get(name)
        if saved is None or saved.get("failed") or history is None:
            why = (
                "not in the baseline"
                if saved is None
                else "failed in the baseline"
                if saved.get("failed")
                else "failed in this run"
            )
            result.verdicts[name] = BaselineVerdict(NOT_COMPARED, why)
            continue
        difference = compare(
            history.step_losses, digests(history), saved["step_losses"], saved.get("final_weights", []), bounds, dtype
        )
        if difference.within:
            verdict = BaselineVerdict(SAME, "bit for bit" if difference.bitwise_identical else "", difference)
        elif dtype != "float32":
            verdict = BaselineVerdict(CHANGED, difference.reason, difference)
        else:
            result.pending[name], verdict = difference, None
        result.verdicts[name] = verdict
    return result


def float64_needed(result: BaselineResult) -> List[str]:
    """The trainers whose float32 difference the float64 runs of both sides could explain."""
    return [name for name in result.pending if baseline_float64(result.report, name) is not None]


def explain_pending(result: BaselineResult, float64_runs: Dict[str, object], why_no_float64: str = "") -> None:
    """Decide every pending float32 difference from this run's float64 runs ({name: a result with .history
    and .error}; `why_no_float64` when there can be none)."""
    for name, difference in result.pending.items():
        result.verdicts[name] = explain(name, difference, result.report, float64_runs.get(name), why_no_float64)
    result.pending = {}


def explain(name: str, difference: Difference, report: dict, float64_result, why_no_float64: str) -> BaselineVerdict:
    """float noise or CHANGED for a float32 difference, from the float64 runs of both sides."""
    saved = baseline_float64(report, name)
    if saved is None:
        note = f"float32; the baseline holds no float64 run of {name} to explain it: {SAVE_FLOAT64}"
    elif why_no_float64:
        note = f"float32; no float64 run here: {why_no_float64}"
    elif float64_result is None or float64_result.history is None:
        note = f"float32; the float64 run failed: {getattr(float64_result, 'error', 'not run')}"
    else:
        float64 = compare(
            float64_result.history.step_losses,
            digests(float64_result.history),
            *saved,
            tolerances("float64"),
            "float64",
        )
        if float64.within:
            return BaselineVerdict(
                FLOAT_NOISE,
                f"{where_float32_left(difference)}; float64 agrees with the baseline's "
                f"float64 run on all {float64.steps} steps (max loss diff "
                f"{float64.max_abs_loss_diff:.2g})",
                difference,
                float64,
            )
        return BaselineVerdict(
            CHANGED, f"{float64.reason} (in float64; {where_float32_left(difference)})", difference, float64
        )
    return BaselineVerdict(CHANGED, f"{difference.reason} ({note})", difference)
