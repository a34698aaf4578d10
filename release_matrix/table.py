"""The release table: every release's measurements (release_matrix.checks) as docs/releases.json and .md.

    python -m release_matrix.table            # reads out/releases/<release>.json for each release

noxfile.py's `table` session runs it after the releases. It judges each check from the
measured figures (exit codes, parity, losses) and writes one row per release of
release_matrix.releases.RELEASES: the JSON, for diffing against the last run, and the
Markdown table inside docs/releases.md between its two marker lines (the text around
them is kept). A release with no measurements in the results directory keeps its row from the
last docs/releases.json, so one release can be re-measured on a fresh clone. Prints the table;
exit code 1 unless every release passed every check (a check whose process hit its time limit
or was stopped makes its row "incomplete").
Needs only the standard library (the project's modules it imports need nothing more).
"""

import argparse
import dataclasses
import json
import os
import sys
from typing import List, Optional

from dtensor_vs_mirrored.shared.errors import TFDS_BROKEN
from dtensor_vs_mirrored.shared.files import write_atomically
from dtensor_vs_mirrored.shared.judge.bounds import FLOAT_TOLERANCE
from release_matrix.releases import BASELINE_RELEASE, RELEASES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join("out", "releases")
DOC_JSON = os.path.join("docs", "releases.json")
DOC_MARKDOWN = os.path.join("docs", "releases.md")
LOSS_TOLERANCE = FLOAT_TOLERANCE["float32"]  # a restore's loss, as parity judges a float32 run
BEGIN, END = "<!-- release table: begin (release_matrix/table.py writes this part) -->", "<!-- release table: end -->"
# (column, compare run, trainer): parity of the distributed trainers against the reference.
PARITY_COLUMNS = [
    ("DTensor batch=8, Adam", "adam", "dtensor"),
    ("DTensor batch=8, SGD", "sgd", "dtensor"),
    ("DTensor batch=4,model=2", "mesh_2d", "dtensor"),
    ("Mirrored 8 replicas, Adam", "adam", "mirrored"),
    ("Mirrored 8 replicas, SGD", "sgd", "mirrored"),
]
DEFAULTS_COLUMN = "compare.py defaults (--data auto)"
BASELINE_COLUMN = f"float64 against the {BASELINE_RELEASE} baseline"
CHECK_COLUMNS = (
    ["fast tests"]
    + [column for column, _, _ in PARITY_COLUMNS]
    + [
        "--adam tutorial caught",
        "DTensorDataset",
        "multi-client",
        "checkpoint cross-restore",
        DEFAULTS_COLUMN,
        BASELINE_COLUMN,
    ]
)
HEADERS = (
    ["release", "project commit", "Keras", "verdict", "install s", "checks s"]
    + CHECK_COLUMNS[:6]
    + ["stale read after assign (combining on)"]
    + CHECK_COLUMNS[6:]
)


@dataclasses.dataclass(frozen=True)
class Check:
    """One check of a release's row: passed (None: not run here), its table cell, the figures it was judged from,
    and for a process that can be stopped whether it finished (None: not such a check). as_json is its row's JSON."""

    ok: Optional[bool]
    cell: str
    figures: dict = dataclasses.field(default_factory=dict)
    finished: Optional[bool] = None

    def as_json(self) -> dict:
        finished = {} if self.finished is None else {"finished": self.finished}
        return {"ok": self.ok, **finished, **self.figures, "cell": self.cell}


NOT_RUN = Check(None, "- (not run)")  # a check added after the release was measured


def _e(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1e}"


def _exit(run: dict) -> str:
    """How a process ended: release_matrix.checks records None for its time limit, -N for signal N."""
    code = run.get("exit_code")
    return "timed out" if code is None else f"killed by signal {-code}" if code < 0 else f"exit {code}"


def parity_check(run: dict, trainer: str) -> Check:
    """A compare.py run's parity for one trainer: passed when it exited 0 and the trainer's parity held."""
    parity = run.get("parity", {}).get(trainer)
    if parity is None:
        reason = run.get("failed_trainers", {}).get(trainer) or run.get("stderr_tail") or "no report"
        return Check(False, f"FAILED ({_exit(run)}: {reason})"[:120])
    ok = run["exit_code"] == 0 and parity["ok"]
    figures = {key: parity[key] for key in ("max_abs_loss_diff", "max_abs_grad_diff", "max_abs_weight_diff")}
    cell = " / ".join(_e(figures[key]) for key in figures)
    return Check(ok, ("ok " if ok else f"FAILED ({_exit(run)}) ") + cell, figures)


def fast_tests_check(tests: dict) -> Check:
    """Every test passed. A pytest stopped by its time limit or a signal did not finish: no verdict."""
    total = tests.get("tests", 0)
    ok = tests["exit_code"] == 0 and total > 0 and tests.get("passed") == total - tests.get("skipped", 0)
    finished = tests["exit_code"] is not None and tests["exit_code"] >= 0
    skipped = tests.get("skipped", 0)  # e.g. float64 where a release's DTensor collectives lack it
    cell = f"{tests.get('passed', 0)}/{total}{f', {skipped} skipped' if skipped else ''} in {tests['seconds']:.0f} s"
    if not finished:
        cell = f"not finished: {_exit(tests)} after {tests['seconds']:.0f} s"
    elif not ok:
        cell = f"FAILED {cell} ({_exit(tests)})"
    figures = {"passed": tests.get("passed", 0), "skipped": skipped, "tests": total, "seconds": tests["seconds"]}
    return Check(ok, cell, {**figures, "failed_tests": tests.get("failed_tests", [])}, finished)


def tutorial_check(run: dict) -> Check:
    """Caught: compare.py exits 1 with DTensor's parity failed (the stale reads and the frozen step count)."""
    parity = run.get("parity", {}).get("dtensor")
    caught = run.get("exit_code") == 1 and parity is not None and not parity["ok"]
    loss = parity["max_abs_loss_diff"] if parity else None
    cell = f"{'yes' if caught else 'NO'} ({_exit(run)}, loss {_e(loss)})"
    return Check(caught, cell, {"exit_code": run.get("exit_code"), "max_abs_loss_diff": loss})


def dataset_check(run: dict, packed: dict) -> Check:
    """DTensorDataset input: parity holds, and the step losses equal the pack run's exactly."""
    check = parity_check(run, "dtensor")
    losses, packed_losses = (r.get("step_losses", {}).get("dtensor") for r in (run, packed))
    same = bool(losses) and losses == packed_losses
    cell = check.cell + (", losses = pack's" if same else ", losses differ from pack's")
    return Check(check.ok and same, cell, {**check.figures, "same_losses_as_pack": same})


def multi_client_check(run: dict) -> Check:
    dtensor, mirrored = parity_check(run, "dtensor"), parity_check(run, "mirrored")
    ok = dtensor.ok and mirrored.ok
    cell = (
        f"ok {_e(dtensor.figures['max_abs_loss_diff'])} / {_e(mirrored.figures['max_abs_loss_diff'])}"
        if ok
        else f"FAILED: dtensor {dtensor.cell}; mirrored {mirrored.cell}"
    )
    return Check(ok, cell, {"dtensor": dtensor.as_json(), "mirrored": mirrored.as_json()})


def restore_check(restore: dict) -> Check:
    """Each trainer's 2nd epoch from the other's checkpoint repeats the uninterrupted losses within tolerance."""
    directions = {name: run for name, run in restore.items() if name != "write"}
    diffs, failures = {}, []
    if restore["write"].get("exit_code") != 0:
        failures.append(f"writing: {_exit(restore['write'])} {restore['write'].get('stderr_tail', '')}")
    for name, run in directions.items():
        diff = run.get("max_abs_loss_diff_to_uninterrupted")
        diffs[name] = diff
        if run.get("exit_code") != 0 or diff is None or diff > LOSS_TOLERANCE:
            failures.append(f"{name}: {_exit(run)}, loss {_e(diff)}")
    worst = max((d for d in diffs.values() if d is not None), default=None)
    cell = f"ok {_e(worst)}" if not failures else "FAILED " + "; ".join(failures)
    return Check(not failures, cell[:160], {"max_abs_loss_diff_to_uninterrupted": diffs})


def defaults_check(run: Optional[dict]) -> Check:
    """compare.py with its defaults: exit 0, both trainers' parity, and tensorflow-datasets working (with
    no MNIST prepared and no network, --data auto then uses the embedded images, as it should)."""
    if run is None:  # measured before this check existed
        return NOT_RUN
    check = multi_client_check(run)
    data = run.get("data", {})
    tfds_works = bool(data) and TFDS_BROKEN not in data["reason"]
    ok, cell = check.ok and tfds_works, check.cell
    if not tfds_works and data:
        cell = f"FAILED: {data['reason']}"[:160]
    elif ok:
        offline = "; no network" if "did not answer" in data["reason"] else ""
        cell += ", data tfds" if data["source"] == "tfds" else f", data {data['source']} (tfds works{offline})"
    return Check(ok, cell, {**check.figures, "data": data})


def baseline_check(run: Optional[dict]) -> Check:
    """The float64 run against release_matrix/baseline-float64.json: passed when it exited 0 and no trainer
    CHANGED. The cell gives the largest differences over the trainers: loss / weight sample / weight sums (rel)."""
    if run is None:  # measured before this check existed
        return NOT_RUN
    trainers = run.get("baseline")
    if not trainers:
        return Check(False, f"FAILED ({_exit(run)}: {run.get('stderr_tail') or 'no report'})"[:160])
    changed = [f"{name} {entry['line']}" for name, entry in trainers.items() if entry["verdict"] == "CHANGED"]
    compared = [entry for entry in trainers.values() if entry["verdict"] in ("same", "float noise")]
    figures = {
        key: max((entry[key] for entry in compared if entry[key] is not None), default=None)
        for key in ("max_abs_loss_diff", "max_abs_weight_sample_diff", "max_rel_weight_sum_diff")
    }
    ok = run["exit_code"] == 0 and not changed and bool(compared)
    if changed:
        cell = "CHANGED: " + "; ".join(changed)
    elif compared and all(entry["bitwise_identical"] for entry in compared):
        cell = "same, bit for bit"
    else:
        cell = ("same " if ok else f"FAILED ({_exit(run)}) ") + " / ".join(_e(value) for value in figures.values())
    if run.get("without_dtensor"):
        cell += "; no dtensor (no float64 here)"
    verdicts = {name: entry["verdict"] for name, entry in trainers.items()}
    return Check(ok, cell[:200], {"verdicts": verdicts, **figures, "without_dtensor": run.get("without_dtensor", "")})


def stale_read_fact(stale: dict) -> dict:
    """Not a pass or fail: whether DTensor's reads after assign are stale, combining on (and off)."""
    on, off = stale["combine_on"], stale["combine_off"]
    if "stale_read" not in on:
        return {"measured": False, "cell": f"not measured ({_exit(on)}: {on.get('stderr_tail', '')})"[:120]}
    cell = f"{'yes' if on['stale_read'] else 'no'}, {on['stale_variables']} of {on['variables']} variables"
    if "stale_read" in off:
        cell += f" (off: {off['stale_variables']})"
    return {
        "measured": True,
        "stale_read": on["stale_read"],
        "stale_variables": on["stale_variables"],
        "variables": on["variables"],
        "read_zero_variables": on["read_zero_variables"],
        "stale_variables_combining_off": off.get("stale_variables"),
        "cell": cell,
    }


def summarize(release: str, measured: Optional[dict]) -> dict:
    """One row: each check judged from the measurements, with its figures and its table cell."""
    if measured is None:
        return {
            "release": release,
            "ok": False,
            "verdict": "not measured",
            "failed_checks": [],
            "unfinished_checks": [],
            "checks": {},
        }
    compare = measured["compare"]
    checks = {"fast tests": fast_tests_check(measured["fast_tests"])}
    checks.update({column: parity_check(compare[run], trainer) for column, run, trainer in PARITY_COLUMNS})
    checks["--adam tutorial caught"] = tutorial_check(compare["adam_tutorial"])
    checks["DTensorDataset"] = dataset_check(compare["dtensor_dataset"], compare["adam"])
    checks["multi-client"] = multi_client_check(compare["multi_client"])
    checks["checkpoint cross-restore"] = restore_check(measured["cross_restore"])
    checks[DEFAULTS_COLUMN] = defaults_check(compare.get("defaults"))
    checks[BASELINE_COLUMN] = baseline_check(compare.get("float64_baseline"))
    failed = [name for name, check in checks.items() if check.ok is False and check.finished is not False]
    unfinished = [name for name, check in checks.items() if check.finished is False]
    verdict = "FAILED" if failed else "incomplete" if unfinished else "ok"
    return {
        "release": release,
        "ok": verdict == "ok",
        "verdict": verdict,
        "failed_checks": failed,
        "unfinished_checks": unfinished,
        "versions": measured["versions"],
        "install_seconds": measured["install_seconds"],
        "run_seconds": measured["run_seconds"],
        "stale_read": stale_read_fact(measured["stale_read"]),
        "checks": {name: check.as_json() for name, check in checks.items()},
    }


def render(rows: List[dict]) -> str:
    """The Markdown table, one row per release, every cell from `rows`."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows:
        if not row["checks"]:
            lines.append("| " + " | ".join([row["release"], "", "not measured"] + [""] * (len(HEADERS) - 3)) + " |")
            continue
        install = "-" if row["install_seconds"] is None else f"{row['install_seconds']:.0f}"
        cells = [
            row["release"],
            row["versions"].get("project", "-"),
            row["versions"].get("keras", "-"),  # the Keras that pip installed with the release (2 to 2.15, then 3)
            row["verdict"],
            install,
            f"{row['run_seconds']:.0f}",
        ]
        cells += [row["checks"][name]["cell"] for name in CHECK_COLUMNS[:6]]
        cells += [row["stale_read"]["cell"]] + [row["checks"][name]["cell"] for name in CHECK_COLUMNS[6:]]
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    measured = [row for row in rows if row["checks"]]
    install = sum(row["install_seconds"] or 0 for row in measured)
    checks = sum(row["run_seconds"] for row in measured)
    pythons = sorted({row["versions"]["python"] for row in measured})
    lines += [
        "",
        f"{len(measured)} of {len(rows)} releases measured, on Python {', '.join(pythons) or '-'}: "
        f"install {install / 60:.1f} min and checks {checks / 60:.1f} min in all.",
    ]
    return "\n".join(lines) + "\n"


def load(results_dir: str, release: str) -> Optional[dict]:
    path = os.path.join(results_dir, f"{release}.json")
    if not os.path.exists(path):
        return None
    with open(path) as file:
        return json.load(file)


def previous_rows(docs_dir: str) -> dict:
    """The rows of the last docs/releases.json, by release: what a fresh clone keeps of releases it did not re-run."""
    path = os.path.join(docs_dir, os.path.basename(DOC_JSON))
    if not os.path.exists(path):
        return {}
    with open(path) as file:
        return {row["release"]: row for row in json.load(file)["releases"]}


def row_for(release: str, measured: Optional[dict], previous: Optional[dict]) -> dict:
    """This release's row: from its measurements here, else the last table's row (a check added since
    shows "- (not run)"), else "not measured"."""
    if measured is not None or previous is None or not previous.get("checks"):
        return summarize(release, measured)
    for column in CHECK_COLUMNS:
        previous["checks"].setdefault(column, NOT_RUN.as_json())
    return previous


def write_markdown(path: str, table: str) -> None:
    """Replace the part of `path` between the markers with `table`; make the file if it is missing."""
    text = open(path).read() if os.path.exists(path) else f"# TensorFlow releases\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: the marker lines are missing; put {BEGIN!r} and {END!r} where the table goes")
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    write_atomically(path, f"{before}{BEGIN}\n{table}{END}{after}".encode())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--results",
        default=os.path.join(ROOT, RESULTS_DIR),
        help="directory of <release>.json files from release_matrix.checks",
    )
    parser.add_argument("--docs", default=os.path.join(ROOT, "docs"), help="where releases.json and .md go")
    args = parser.parse_args(argv)
    previous = previous_rows(args.docs)
    rows = [row_for(release, load(args.results, release), previous.get(release)) for release in RELEASES]
    os.makedirs(args.docs, exist_ok=True)
    rows_json = json.dumps({"releases": rows}, indent=2) + "\n"
    write_atomically(os.path.join(args.docs, os.path.basename(DOC_JSON)), rows_json.encode())
    table = render(rows)
    write_markdown(os.path.join(args.docs, os.path.basename(DOC_MARKDOWN)), table)
    print(table, end="")
    failed = [
        f"{row['release']} {row['verdict']}" + (f" ({', '.join(checks)})" if checks else "")
        for row in rows
        if not row["ok"]
        for checks in [row["failed_checks"] + row["unfinished_checks"]]
    ]
    print(
        f"wrote {DOC_JSON} and {DOC_MARKDOWN}; "
        + (f"not ok: {'; '.join(failed)}" if failed else "every release passed")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
