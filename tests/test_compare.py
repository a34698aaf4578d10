"""compare.py end to end at small size on embedded data: exit codes, tables, JSON, plots.

One full run (all three trainers, 2 devices, 1 epoch of 256 examples) is shared by
the table, JSON and plot tests (a new process, as a user runs it); the bad options run in this one.
"""

import os
import re

import pytest

from dtensor_vs_mirrored.shared.console import LINE_WIDTH
from tests.cli import PNG_SIZE, SMALL, check_report, png_size, read_report, run_compare, run_here


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The default's trainer processes (DTensor and MirroredStrategy in a process of their own) and timing."""
    out = tmp_path_factory.mktemp("compare")
    own = [arg for arg in SMALL if arg not in ("--trainer-process", "shared", "--no-timing")]  # timed, too
    result = run_compare(
        *own, "--json", str(out / "report.json"), "--plots", str(out / "plots"), "--logdir", str(out / "logs")
    )
    return result, out


def test_full_run_exits_0_with_parity(full_run):
    result, _ = full_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.rstrip().endswith("PARITY OK")
    joined = result.stdout.replace("\n  ", " ")  # the header's lines broken to fit, joined
    assert (
        "processes: reference, dtensor and mirrored in a trainer process (TF_NUM_INTRAOP_THREADS=1); the reference's "
        "timing rounds here (TensorFlow's default threads)" in joined
    )


TENSORFLOW_LOG_LINE = re.compile(
    r"^[IWEF]\d{4} |^WARNING: All log messages before absl|oneDNN|cuInit|cuda drivers|"
    r"DTensor cache key lookup|XLA service"
)


def test_a_run_prints_only_the_projects_own_lines(full_run):
    """TensorFlow's start-up and per-trace messages are hidden; nothing goes to stderr on success."""
    result, _ = full_run
    assert result.stderr == ""
    assert not [line for line in result.stdout.splitlines() if TENSORFLOW_LOG_LINE.search(line)]


@pytest.mark.extended  # one extra compare.py run for one flag
def test_verbose_shows_tensorflows_own_lines():
    result = run_compare(*SMALL, "--trainers", "reference", "--verbose")
    assert result.returncode == 0, result.stderr[-2000:]
    assert TENSORFLOW_LOG_LINE.search(result.stderr), result.stderr[-2000:]


def test_reports_and_plots_honour_the_umask(full_run):
    _, out = full_run
    umask = os.umask(0o022)
    os.umask(umask)
    for path in [out / "report.json", *(out / "plots").iterdir()]:
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path


def test_tables_have_a_row_per_trainer_and_the_promised_columns(full_run):
    result, _ = full_run
    lines = result.stdout.splitlines()
    title = lines.index("Parity against the single-device reference, all 4 steps")
    assert lines[title + 1] == (
        "float32, |diff| <= atol + rtol |reference|: loss 1e-04 + 1e-04, gradients 1e-04 + "
        "1e-04, final weights 1e-03 + 1e-03"
    )
    parity_header = next(line for line in lines if line.startswith("| trainer") and "max |loss diff|" in line)
    for column in ("at step", "rel loss diff", "max |grad diff|", "max |weight diff|", "verdict"):
        assert column in parity_header
    results_header = next(line for line in lines if line.startswith("| trainer") and "test acc" in line)
    for column in ("devices / mesh", "train loss", "train acc", "test loss", "test acc"):
        assert column in results_header
    speed_header = next(line for line in lines if line.startswith("| trainer") and "examples/s" in line)
    for column in ("step p50 ms", "step p95 ms", "trace s", "memory/device MB", "peak MB"):
        assert column in speed_header
    rows = [line for line in lines if re.match(r"\| (reference|dtensor|mirrored) ", line)]
    assert (
        sorted(r.split("|")[1].strip() for r in rows) == ["dtensor"] * 3 + ["mirrored"] * 3 + ["reference"] * 2
    )  # parity rows + results and speed rows
    assert sum(r.rstrip().endswith("| ok        |") for r in rows) == 2
    assert max(len(line) for line in lines) <= LINE_WIDTH
    # The epoch lines share one format across trainers.
    for name in ("reference", "dtensor", "mirrored"):
        assert re.search(
            rf"^{name}\s+epoch 1/1  train_loss \d\.\d{{4}}  train_acc \d\.\d{{4}}  "
            rf"test_loss \d\.\d{{4}}  test_acc \d\.\d{{4}}  time \d+\.\d\ds$",
            result.stdout,
            re.M,
        )


def test_json_report_keys_and_types(full_run):
    _, out = full_run
    report = read_report(out / "report.json")
    assert report["ok"] is True
    assert report["config"]["devices"] == 2 and report["config"]["epochs"] == 1
    assert report["environment"]["tensorflow"].startswith("2.")
    assert report["environment"]["data_source"] == "embedded"
    assert report["environment"]["devices"] == ["CPU:0", "CPU:1"]
    for name in ("reference", "dtensor", "mirrored"):
        trainer = report["trainers"][name]
        assert len(trainer["step_losses"]) == 4 and all(isinstance(v, float) for v in trainer["step_losses"])
        (epoch,) = trainer["epochs"]
        for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "train_seconds"):
            assert isinstance(epoch[key], float)
        # One epoch, which traces, measures nothing: the figures are the timed rounds' after it.
        timing = trainer["timing"]
        assert timing["steps"] >= 30 and trainer["throughput_examples_per_s"] > 0
        # 3 rounds each, in turn between 4 of the reference's, which both share: the reference's 4 its own
        assert [len(timing["rounds"]), len(timing["beside"])] == ([4, 0] if name == "reference" else [3, 4])
        assert (timing["ratio_to_reference"] is None) == (name == "reference")
        assert report["compute"]["achieved_gflops"][name] > 0
        assert [epoch["traces"] > 0 for epoch in trainer["epochs"]] == [True]
        (busiest, *_) = sorted(trainer["memory_per_device"], key=lambda record: -record["weight_bytes"])
        assert busiest["weight_bytes"] >= 4 * 905_010  # the 784-700-500-10 MLP's parameters, float32
    assert [d["device"] for d in report["trainers"]["dtensor"]["memory_per_device"]] == ["CPU:0", "CPU:1"]
    shared = [report["trainers"][name]["timing"]["beside"] for name in ("dtensor", "mirrored")]
    assert shared[0] == shared[1] == report["trainers"]["reference"]["timing"]["rounds"]  # the same 4 rounds
    for name in ("dtensor", "mirrored"):
        parity = report["parity"][name]
        for key in ("max_abs_loss_diff", "max_rel_loss_diff", "max_abs_grad_diff", "max_abs_weight_diff"):
            assert isinstance(parity[key], float) and parity[key] >= 0
        assert parity["ok"] is True and parity["verdict"] == "ok" and parity["reason"] == ""
        assert parity["within_tolerance"] is True
        assert parity["dtype"] == "float32" and parity["steps"] == 4 and parity["float64"] is None
        assert parity["tolerances"] == {
            "loss": [1e-4, 1e-4],
            "gradient": [1e-4, 1e-4],
            "weight": [1e-3, 1e-3],
            "state": [0.0, 1e-4],
        }
        assert parity["max_abs_loss_diff"] <= parity["tolerances"]["loss"][0]
    assert "reference" not in report["parity"] and report["float64_rerun"] is None
    assert report["compute"]["yardstick_gflops"] >= max(report["compute"]["achieved_gflops"].values())
    machine = report["environment"]["machine"]
    assert machine["device_type"] == "CPU" and machine["logical_devices"] == 2 and machine["cores"] >= 1
    assert machine["speeds_transfer"] is False and machine["line"].startswith("speeds: 2 logical CPUs sharing ")


def test_speeds_come_from_timed_rounds_whatever_the_epochs_and_say_what_they_stand_for(full_run):
    """One epoch, which traces, measures nothing; the timed rounds after it do (--no-timing: the epochs, as in a
    float64 run: test_a_float64_run_measures_its_matmul_peak_in_float64_and_says_so)."""
    result, _ = full_run
    speed = result.stdout.split("\nSpeed and memory", 1)[1]
    assert speed.startswith(" (each trainer's steady train call timed after training, 3 rounds of 10+ steps")
    rows = [line for line in speed.splitlines() if re.match(r"\| (reference|dtensor|mirrored) +\|", line)]
    assert len(rows) == 3 and all(re.match(r"\d[\d,]* \(", row.split("|")[2].strip()) for row in rows)
    assert "of the fastest this run measured: " in result.stdout
    assert "no epoch after the first ran 0.1 s" not in result.stdout
    assert "speeds: 2 logical CPUs sharing " in result.stdout


def test_plots_are_valid_pngs_of_the_expected_size(full_run):
    _, out = full_run
    for name in ("loss.png", "accuracy.png", "loss_diff.png", "throughput.png"):
        assert png_size(out / "plots" / name) == PNG_SIZE
    assert not [p for p in os.listdir(out / "plots") if p.startswith(".tmp-")]


def test_tensorboard_scalars_per_trainer(full_run):
    _, out = full_run
    for name in ("reference", "dtensor", "mirrored"):
        assert any(f.startswith("events.out.tfevents") for f in os.listdir(out / "logs" / name))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trainers", "dtensor,nope"], r"unknown trainer nope"),
        (["--mesh", "batch=4"], r"--mesh batch=4 covers 4 devices but there are 2"),
        (["--epochs", "-2"], r"--epochs: -2 is negative"),
        (["--data", "{tmp}/empty"], r"train-images-idx3-ubyte\[\.gz\] not found"),
        (["--json", "{tmp}/missing/report.json"], r"--json: directory .*missing does not exist"),
    ],
)
def test_bad_options_exit_2_and_leave_no_report(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    existing = tmp_path / "report.json"
    existing.write_text('{"previous": true}')
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    json_args = [] if "--json" in args else ["--json", str(existing)]
    result = run_here(*SMALL, *args, *json_args, "--plots", tmp_path / "plots")
    code, out, err = result.returncode, result.stdout, result.stderr
    assert code == 2, out[-2000:] + err[-2000:]
    assert len(err.splitlines()) == 1 and re.search(message, err), err[-2000:]
    assert "epoch 1/" not in out
    assert existing.read_text() == '{"previous": true}'
    assert not (tmp_path / "plots").exists() or not os.listdir(tmp_path / "plots")


def test_a_trainer_that_raises_is_reported_failed_and_the_others_still_run(devices, embedded, monkeypatch):
    """The failure path of compare.py in-process: the trainer's error becomes one table cell."""
    import io

    from dtensor_vs_mirrored.mirrored_impl.trainer import MirroredTrainer
    from dtensor_vs_mirrored.shared.config import Config
    from dtensor_vs_mirrored.shared.report import document
    from dtensor_vs_mirrored.shared.report import tables as report
    from dtensor_vs_mirrored.shared.run import sequence

    def broken_epoch(*args, **kwargs):
        raise RuntimeError("replica 3 lost its device\nsecond line that must not show")

    monkeypatch.setattr(MirroredTrainer, "train_epoch", broken_epoch)
    small = embedded.__class__(
        embedded.x_train[:128],
        embedded.y_train[:128],
        embedded.x_test[:64],
        embedded.y_test[:64],
        "embedded",
        "test slice",
    )
    # In this process, where the monkeypatch is (a trainer process would import the real fit).
    config = Config(trainers=("dtensor", "mirrored"), devices=2, epochs=1, batch_size=64, quiet=True)
    run = sequence.train_all(config.replace(trainer_process="shared"), small, devices[:2])
    assert not run.ok and run.parity["dtensor"].ok and "mirrored" not in run.parity
    assert run.results["mirrored"].error.startswith("RuntimeError: replica 3 lost its device (test_compare.py:")
    out = io.StringIO()
    report.print_tables(run, [], out=out)
    assert re.search(r"^\| mirrored .*\| FAILED    \|$", out.getvalue(), re.M)  # the parity row's keyword
    assert re.search(
        r"^mirrored   RuntimeError: replica 3 lost its device \(test_compare.py:\d+\)$", out.getvalue(), re.M
    )  # and the reason under the table
    assert "second line" not in out.getvalue() and out.getvalue().rstrip().endswith("PARITY FAILED")
    written = check_report(document.finite(document.report_dict(run, [])))  # a failed trainer's report, too
    assert written["trainers"]["mirrored"]["error"] == run.results["mirrored"].error
    assert "RuntimeError: replica 3 lost its device" in written["trainers"]["mirrored"]["traceback"]


@pytest.mark.parametrize(
    "trainers, shown, hidden",
    [
        (("reference", "mirrored"), "global batch 128, per replica 16 (MirroredStrategy); 3 epochs", "DTensor"),
        (("reference", "dtensor"), "global batch 128, per replica 16 (DTensor); 3 epochs", "MirroredStrategy"),
        (("reference",), "global batch 128; 3 epochs", "per replica"),
        (
            ("reference", "dtensor", "mirrored"),
            "global batch 128, per replica 16 (DTensor) / 16 (MirroredStrategy); 3 epochs",
            "nothing hidden",
        ),
    ],
)
def test_the_header_names_only_what_the_chosen_trainers_use(devices, embedded, trainers, shown, hidden):
    from dtensor_vs_mirrored.shared.config import Config
    from dtensor_vs_mirrored.shared.report.header import header

    # A mesh for 3 devices: were the mesh parsed without DTensor, this would raise.
    from dtensor_vs_mirrored.shared.training.registry import describe_runs

    mesh = None if "dtensor" in trainers else "batch=3"
    config = Config(trainers=trainers, mesh=mesh)
    text = header(config, devices, embedded, describe_runs(config))
    assert shown in text.splitlines() and hidden not in text
    assert ("DTensor mesh batch=8" in text.splitlines()[0]) == ("dtensor" in trainers)
    assert max(len(line) for line in text.splitlines()) <= LINE_WIDTH


def test_a_float64_run_measures_its_matmul_peak_in_float64_and_says_so(devices, embedded):
    import io

    from dtensor_vs_mirrored.shared.config import Config
    from dtensor_vs_mirrored.shared.measure.peak import matmul_peak_gflops
    from dtensor_vs_mirrored.shared.report import document
    from dtensor_vs_mirrored.shared.report import tables as report
    from dtensor_vs_mirrored.shared.run import sequence

    small = embedded.__class__(
        embedded.x_train[:256],
        embedded.y_train[:256],
        embedded.x_test[:64],
        embedded.y_test[:64],
        "embedded",
        "test slice",
    )
    config = Config(trainers=("reference",), devices=1, epochs=1, batch_size=64, quiet=True, dtype="float64")
    run = sequence.train_all(config, small, devices[:1])
    run.matmul_peak_gflops = matmul_peak_gflops(devices[0], sizes=(512,), repeats=2, dtype=config.dtype)
    out = io.StringIO()
    report.print_tables(run, [], out=out)
    assert "GFLOP/s: reference - of the fastest this run measured: a float64 matmul on one device" in out.getvalue()
    assert "-: no epoch after the first ran 0.1 s or more without tracing" in out.getvalue()  # float64: untimed
    assert document.compute_facts(run)["matmul_peak_dtype"] == "float64" and run.matmul_peak_gflops > 0


def test_a_trainer_that_beats_the_matmul_is_the_yardstick_and_none_reads_over_100_percent():
    """The model's FLOP count is a convention that counts work a step skips: the reference once read 114% of a
    matmul "peak" (126 against 110 GFLOP/s)."""
    from dtensor_vs_mirrored.shared.measure.peak import yardstick
    from dtensor_vs_mirrored.shared.report.tables import gflops_line

    achieved = {"reference": 126.0, "dtensor": 11.0, "mirrored": None}
    top, what = yardstick(110.0, achieved)
    compute = {
        "flops_per_example": 5.42e6,
        "matmul_peak_gflops": 110.0,
        "matmul_peak_dtype": "float32",
        "achieved_gflops": achieved,
        "yardstick_gflops": top,
        "yardstick": what,
    }
    assert gflops_line(compute) == (
        "\nGFLOP/s: reference 126 (100%), dtensor 11 (9%), mirrored - of the fastest this run measured: the "
        "reference's training, 126 GFLOP/s (a float32 matmul on one device: 110)\n(5.42 MFLOP per example by the "
        "model's count, forward + backward)"
    )
    assert yardstick(130.0, achieved) == (130.0, "matmul")


def test_when_auto_falls_back_the_json_says_so(devices, monkeypatch):
    """The state a broken tensorflow-datasets leaves (test_data.py): --data auto trains on the embedded set,
    and the report's environment.data_fallback says why (null when the data is what was asked for)."""
    import sys
    import types

    from dtensor_vs_mirrored.shared.config import Config
    from dtensor_vs_mirrored.shared.report import document
    from dtensor_vs_mirrored.shared.run import sequence
    from dtensor_vs_mirrored.shared.training.data import load_data

    monkeypatch.setitem(sys.modules, "tensorflow_datasets", types.ModuleType("tensorflow_datasets"))
    config = Config(
        trainers=("reference",),
        devices=1,
        epochs=1,
        batch_size=64,
        quiet=True,
        data="auto",
        train_examples=128,
        test_examples=64,
        timing=False,
    )
    fallen_back = sequence.train_all(config, load_data("auto", 128, 64), devices[:1])
    environment = document.report_dict(fallen_back, [])["environment"]
    assert environment["data_source"] == "embedded"
    assert environment["data_fallback"].startswith("tensorflow_datasets does not work here (AttributeError")
    asked_for = sequence.train_all(config.replace(data="embedded"), load_data("embedded", 128, 64), devices[:1])
    assert document.report_dict(asked_for, [])["environment"]["data_fallback"] is None


def test_the_header_says_when_the_training_set_is_reshuffled():
    from dtensor_vs_mirrored.shared.config import Config
    from dtensor_vs_mirrored.shared.report.header import describe_training

    assert describe_training(Config()) == "adam lr 0.001 (fixed Adam); float32; seed 22"
    shuffled = describe_training(Config(shuffle=True))
    assert shuffled == "adam lr 0.001 (fixed Adam); float32; seed 22" + (
        "; the training set reshuffled every epoch from the seed (--shuffle)"
    )
