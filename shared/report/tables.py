"""What compare.py prints after training: the parity table and the reasons under it, the results, speed and
memory, GFLOP/s, the step profile, the sweep's table, --repeat's and --baseline's tables and the last lines.
Every line within shared.console.LINE_WIDTH."""

from typing import List

from tabulate import tabulate

from dtensor_vs_mirrored.shared.console import fit_width
from dtensor_vs_mirrored.shared.devices import op_determinism_enabled
from dtensor_vs_mirrored.shared.judge.verdict import passed
from dtensor_vs_mirrored.shared.measure.history import MIN_MEASURED_SECONDS, step_time_percentiles_ms, throughput
from dtensor_vs_mirrored.shared.measure.memory import MB, largest_total_bytes
from dtensor_vs_mirrored.shared.measure.timing import ROUND_SECONDS, ROUND_STEPS, ROUNDS, wanted
from dtensor_vs_mirrored.shared.model.registry import definition_for
from dtensor_vs_mirrored.shared.report import baseline as baseline_report
from dtensor_vs_mirrored.shared.report import profile as profile_report
from dtensor_vs_mirrored.shared.report.document import compute_facts
from dtensor_vs_mirrored.shared.report.header import run_machine
from dtensor_vs_mirrored.shared.report.parity import PARITY_HEADERS, last_line, parity_notes, parity_rows, parity_title
from dtensor_vs_mirrored.shared.report.sweep import (
    SWEEP_HEADERS,
    best_against_one_device,
    conclusion_lines,
    sweep_collectives_line,
    sweep_notes,
    sweep_rows,
)
from dtensor_vs_mirrored.shared.training.export import LOGIT_TOLERANCE

RESULT_HEADERS = [
    "trainer",
    "devices / mesh",
    "collectives",
    "train loss",
    "train acc",
    "test loss",
    "test acc",
    "examples/s (spread)",
    "step p50 ms",
    "step p95 ms",
    "trace s",
    "memory/device MB",
    "peak MB",
]
# One table of all twelve is ~180 columns: printed as two, "Results" and "Speed and memory", each
# within shared.console.LINE_WIDTH; the trainer's name leads both.
RESULT_COLUMNS = 7  # trainer, devices / mesh, collectives, losses and accuracies; the rest are speed and memory
ACCURACY_COLUMNS = (4, 6)  # left out for a model whose labels are not classes (a regression: ModelDefinition.targets)
BELOW_FLOOR = (
    f"-: no epoch after the first ran {MIN_MEASURED_SECONDS:g} s or more without tracing (the timing "
    f"floor, shared/measure/history.py);\n   use more --epochs or --train-examples"
)


def result_rows(run) -> List[list]:
    rows = []
    train_examples = len(run.data.y_train)
    for name, result in run.results.items():
        history = result.history
        if history is None:
            rows.append([name, "-", "-", "-", "-", "-", "-", "FAILED", "-", "-", "-", "-", "-"])  # why: under parity
            continue
        last = history.epochs[-1] if history.epochs else None
        figures = throughput(history, train_examples)
        percentiles = step_time_percentiles_ms(history)
        rows.append(
            [
                name,
                history.placement,
                history.collectives.name if history.collectives else "-",
                *(
                    f"{v:.4f}"
                    for v in (
                        (last.train_loss, last.train_accuracy, last.test_loss, last.test_accuracy)
                        if last
                        else (float("nan"),) * 4
                    )
                ),
                "-" if figures is None else f"{figures[0]:,.0f} ({figures[1]:,.0f}-{figures[2]:,.0f})",
                *(("-", "-") if percentiles is None else (f"{percentiles[0]:.2f}", f"{percentiles[1]:.2f}")),
                f"{history.trace_seconds:.2f}",
                f"{largest_total_bytes(history.memory_per_device) / MB:,.2f}",
                f"{result.peak_shown_mb:,.0f}",
            ]
        )
    return rows


def collectives_line(run) -> str:
    """Under the results: which collective implementation each trainer ran, and why that one."""
    return "collectives: " + "; ".join(
        f"{name} {result.history.collectives.describe()}"
        for name, result in run.results.items()
        if result.history is not None and result.history.collectives is not None
    )


def clipping_line(run) -> str:
    """Under the results with --clip-global-norm: how often each trainer clipped (its details' `clipping`)."""
    found = [
        f"{name} {result.history.details['clipping']}"
        for name, result in run.results.items()
        if result.history is not None and "clipping" in result.history.details
    ]
    return "clipping: " + "; ".join(found) if found else ""


def print_profile(run, link_gbps, out=None) -> None:
    """--profile: each trainer's step parts, and under them its bytes per step."""
    histories = [(name, result.history) for name, result in run.results.items()]
    rows = profile_report.trainer_rows(histories)
    if rows:
        print(f"\n{profile_report.TITLE}", file=out)
        print(tabulate(rows, ["trainer", *profile_report.PART_HEADERS], tablefmt="github"), file=out)
        for line in profile_report.traffic_lines(
            [(name, history.traffic, history.traffic_missing) for name, history in histories if history is not None],
            link_gbps,
        ):
            print(fit_width(line, indent=2), file=out)


def print_sweep_profile(sweep, link_gbps, out=None) -> None:
    """--profile with --sweep-devices: the same for every configuration of the sweep."""
    rows = profile_report.sweep_rows(sweep)
    if rows:
        print(
            "\nStep profile of every sweep configuration, ms per step (each reference's: the step profile above)",
            file=out,
        )
        print(tabulate(rows, ["devices", "configuration", *profile_report.PART_HEADERS], tablefmt="github"), file=out)
        for line in profile_report.traffic_lines(
            [(f"{e.devices} devices {e.trainer} {e.label}", e.traffic, e.traffic_missing) for e in sweep], link_gbps
        ):
            print(fit_width(line, indent=2), file=out)


def print_tables(run, sweep, out=None) -> None:
    if run.parity or any(r.failed for r in run.results.values()):
        print(f"\n{parity_title(run)}", file=out)
        print(tabulate(parity_rows(run), PARITY_HEADERS, tablefmt="github"), file=out)
        for note in parity_notes(run):
            print(fit_width(note), file=out)
    below_floor = print_results(run, out)
    for line in export_lines(run):
        print(fit_width(line), file=out)
    print_profile(run, run.config.link_gbps, out)
    if sweep:
        print_sweep(run, sweep, below_floor, out)
    print_repeats_and_baseline(run, out)
    print(f"\n{last_line(run, passed(run, sweep))}", file=out)
    if run.baseline is not None:
        print(baseline_report.last_line(run.baseline), file=out)


def print_results(run, out) -> bool:
    """The results table, the speed and memory table and the GFLOP/s line; True when a figure was below the
    timing floor."""
    rows = result_rows(run)
    shown = [
        index
        for index in range(RESULT_COLUMNS)
        if index not in ACCURACY_COLUMNS or definition_for(run.config).has_accuracy
    ]
    print("\nResults after the last epoch", file=out)
    print(
        tabulate([[row[i] for i in shown] for row in rows], [RESULT_HEADERS[i] for i in shown], tablefmt="github"),
        file=out,
    )
    print(fit_width(collectives_line(run), indent=2), file=out)
    if clipping_line(run):
        print(fit_width(clipping_line(run), indent=2), file=out)
    print(speed_title(run), file=out)
    print(
        tabulate(
            [row[:1] + row[RESULT_COLUMNS:] for row in rows],
            RESULT_HEADERS[:1] + RESULT_HEADERS[RESULT_COLUMNS:],
            tablefmt="github",
        ),
        file=out,
    )
    compute = compute_facts(run)
    below_floor = any(row[RESULT_COLUMNS] == "-" for row in rows) or None in compute["achieved_gflops"].values()
    if compute["yardstick_gflops"]:
        print(fit_width(gflops_line(compute), indent=2), file=out)
    if below_floor:
        print(BELOW_FLOOR, file=out)
    return below_floor


def speed_title(run) -> str:
    """The speed table's title: where its figures come from, timed rounds or measured epochs."""
    timed = any(result.history is not None and result.history.timing is not None for result in run.results.values())
    source = (
        f"each trainer's steady train call timed after training, {ROUNDS} rounds of {ROUND_STEPS}+ steps and "
        f"{ROUND_SECONDS:g}+ s,\nthe distributed ones' each between two of the reference's (median and min-max over "
        f"the rounds)"
        if timed
        else "throughput and step times from the epochs after the first, which traces"
        + (
            ",\neach epoch's time its model.fit call's batches', from each one's start to its end"
            if run.config.fit
            else ""
        )
    )
    return (
        f"\nSpeed and memory ({source};\nmemory/device: weights + optimizer state on the busiest device; peak MB: "
        f"each trainer's own, as the header says)"
    )


def gflops_line(compute: dict) -> str:
    """Each trainer's achieved GFLOP/s as a share of the fastest rate the run measured, never over 100%: the
    matmul's, or a trainer's that beat it (the model's FLOP count is a convention: shared/measure/peak.py)."""
    top, dtype = compute["yardstick_gflops"], compute["matmul_peak_dtype"]
    achieved = ", ".join(
        f"{name} -" if gflops is None else f"{name} {gflops:.0f} ({gflops / top:.0%})"
        for name, gflops in compute["achieved_gflops"].items()
    )
    matmul = f"a {dtype} matmul on one device"
    fastest = (
        f"{matmul}, {top:.0f} GFLOP/s"
        if compute["yardstick"] == "matmul"
        else f"the {compute['yardstick']}'s training, {top:.0f} GFLOP/s ({matmul}: {compute['matmul_peak_gflops']:.0f})"
    )
    return (
        f"\nGFLOP/s: {achieved} of the fastest this run measured: {fastest}\n"
        f"({compute['flops_per_example'] / 1e6:.2f} MFLOP per example by the model's count, forward + backward)"
    )


def sweep_legend(sweep) -> str:
    """What the sweep table's columns hold: timed rounds' figures, or without timing the fastest epochs'."""
    timed = any(entry.ratio_spread for entry in sweep)
    speeds = (
        "ex/s: training examples per second, the median of its timed rounds; (ref.): the reference's rounds around "
        "them; ratio: the median of its rounds' ratios, each to the mean of the reference's rounds just before and "
        "after it, (spread) their min-max; ?: the spread overlaps another's at that count, or too few steps to rank"
        if timed
        else "ex/s: training examples per second, its fastest epoch after the first; (ref.): the same of the "
        "reference; ratio: the two's; ?: too few measured steps to rank"
    )
    return fit_width(
        f"(dev: devices; {speeds}; MB/dev: weights + optimizer state on the busiest device; MB/step: what the busiest "
        f"device sends or receives per step; mark, the fastest at that count by ratio: M the DTensor mesh, A the "
        f"approach)",
        indent=0,
    )


def sweep_title(config) -> str:
    """The sweep table's title: how its speeds were taken (timed, or from the epochs where the run is not timed)."""
    speeds = "timed beside it" if wanted(config) else "its speeds from its epochs (not timed: --no-timing or float64)"
    return f"Throughput against device count: every configuration, judged against this run's reference and {speeds}"


def print_sweep(run, sweep, below_floor: bool, out) -> None:
    """The sweep's table, its legend, the lines under it and its conclusion."""
    print("\n" + fit_width(sweep_title(run.config), indent=2), file=out)
    print(tabulate(sweep_rows(sweep), SWEEP_HEADERS, tablefmt="github"), file=out)
    print(sweep_legend(sweep), file=out)
    model = describe_model_short(run.config)
    conclusion = conclusion_lines(sweep, model, run.config.device_memory_mb) + [run_machine(run.config).describe()]
    for line in [sweep_collectives_line(sweep)] + sweep_notes(sweep) + [best_against_one_device(sweep)] + conclusion:
        if line:
            print(fit_width(line, indent=2), file=out)
    if not below_floor and any(e.throughput_examples_per_s is None and not e.skipped for e in sweep):
        print(BELOW_FLOOR, file=out)
    print_sweep_profile(sweep, run.config.link_gbps, out)


def describe_model_short(config) -> str:
    definition = definition_for(config)
    return definition.description or definition.name


def print_repeats_and_baseline(run, out=None) -> None:
    """--repeat's table (shared/judge/repeats.py) and --baseline's (shared/judge/baseline.py)."""
    if run.reproducibility:
        print(
            fit_width(
                f"\nReproducibility: each trainer trained {run.config.repeat} times from the same start in "
                f"one process (the header's), compared bit for bit (op determinism "
                f"{'on: --deterministic' if op_determinism_enabled() else 'off; --deterministic turns it on'})"
            ),
            file=out,
        )
        print(
            tabulate(
                [[name, found.runs, found.line()] for name, found in run.reproducibility.items()],
                ["trainer", "runs", "result"],
                tablefmt="github",
            ),
            file=out,
        )
    if run.baseline is not None:
        print(fit_width(f"\n{baseline_report.title(run.baseline)}"), file=out)
        print(
            tabulate(baseline_report.rows(run.baseline), baseline_report.BASELINE_HEADERS, tablefmt="github"), file=out
        )


def export_lines(run) -> List[str]:
    """--export: where each trainer's SavedModel went, and how close it serves the trainer's own logits."""
    lines = []
    for name, result in run.results.items():
        details = result.history.details if result.history is not None else {}
        if "export" in details:
            lines.append(
                f"{name:<10} exported {details['export']}: max |logit diff| "
                f"{details['export_max_abs_logit_diff']} from the trainer's own (tolerance {LOGIT_TOLERANCE:g})"
            )
    return ([""] + lines) if lines else []
