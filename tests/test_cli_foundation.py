"""compare.py as a user runs it: help, the reference run, and one-line errors with exit code 2."""

import re

import pytest

from tests.cli import run_compare, run_here

OPTIONS = [
    "--trainers",
    "--devices",
    "--device-type",
    "--mesh",
    "--epochs",
    "--batch-size",
    "--learning-rate",
    "--seed",
    "--optimizer",
    "--adam",
    "--data",
    "--train-examples",
    "--test-examples",
    "--tolerance",
    "--json",
    "--plots",
    "--logdir",
    "--sweep-devices",
    "--quiet",
    "--hidden",
    "--shuffle",
    "--dtensor-input",
    "--mirrored-update",
    "--keep-checkpoints",
    "--verbose",
    "--dtype",
    "--no-explain",
    "--sweep-meshes",
    "--baseline",
    "--with-float64",
    "--repeat",
    "--deterministic",
    "--profile",
    "--link-gbps",
    "--no-dtensor-nccl",
]


def test_help_lists_every_option_with_its_default():
    result = run_compare("--help")
    assert result.returncode == 0
    for option in OPTIONS:
        assert option in result.stdout
    assert "(default: 3)" in result.stdout and "(default: auto)" in result.stdout


def test_every_option_states_its_default_in_help():
    """Each option's paragraph of --help as a user reads it says its default (--fit's said "the default trainers"
    and no default of its own)."""
    from dtensor_vs_mirrored.shared.cli import build_parser

    text = build_parser().format_help().split("options:", 1)[1]
    paragraphs = re.split(r"\n  (?=-)", text)[1:]  # each option's lines, from its flag
    assert len(paragraphs) >= 40
    for paragraph in paragraphs:
        said = " ".join(paragraph.split())
        if said.startswith("-h, --help"):
            continue
        assert "(default" in said or "default:" in said, said


def test_reference_prints_three_epochs_of_falling_loss():
    result = run_here("--trainers", "reference", "--data", "embedded", "--no-timing")
    assert result.returncode == 0, result.stderr[-2000:]
    losses = [float(v) for v in re.findall(r"^reference\s+epoch \d/3\s+train_loss (\S+)", result.stdout, re.M)]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2]
    assert "data: embedded (--data embedded); 4000 train, 1000 test examples" in result.stdout
    assert "TensorFlow 2." in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trainers", "reference,nope"], r"argument --trainers: unknown trainer nope"),
        (["--epochs", "-1"], r"argument --epochs: -1 is negative"),
        (["--epochs", "0"], r"argument --epochs: 0 trains nothing, so no step would be judged; use 1 or more"),
        (["--batch-size", "0"], r"argument --batch-size: 0 is not a positive integer"),
        (["--optimizer", "rmsprop"], r"argument --optimizer: invalid choice"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args, message):
    result = run_compare(*args)  # as a command: these fail before TensorFlow is imported
    assert result.returncode == 2
    assert re.search(message, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "/no/such/dir"], r"--data /no/such/dir: no such directory"),
        (["--data", "embedded", "--train-examples", "5000"], r"--train-examples 5000 is more than the 4000"),
        (["--json", "/no/such/dir/report.json"], r"--json: directory /no/such/dir does not exist"),
        (["--json", f"{__file__}/report.json"], r"--json: .*test_cli_foundation\.py is a file, not a directory;"),
    ],
)
def test_bad_input_exits_2_before_training(args, message):
    result = run_here("--trainers", "reference", *args)  # in this process: see tests/cli.py
    code, out, err = result.returncode, result.stdout, result.stderr
    assert code == 2
    assert len(err.splitlines()) == 1 and re.search(message, err), err[-1000:]
    assert "epoch 1/" not in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch-size", "0"], "compare.py: error: argument --batch-size: 0 is not a positive integer; see --help\n"),
        (["--no-such-flag"], "compare.py: error: unrecognized arguments: --no-such-flag; see --help\n"),
        (
            ["--reference-from-scratch"],
            "compare.py: error: --reference-from-scratch compares trainers resumed from a "
            "checkpoint with a reference trained from the initial values; give --restore PATH "
            "too\n",
        ),
    ],
)
def test_main_in_python_returns_2_for_any_bad_input_without_raising(argv, message, capsys):
    """compare.main(argv) is the Python API: an argparse error is the same return value and line as any other
    bad input (no SystemExit), so a caller gets one behaviour."""
    from dtensor_vs_mirrored.shared import cli as compare

    assert compare.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == message and captured.out == ""


def test_main_in_python_returns_0_for_help(capsys):
    from dtensor_vs_mirrored.shared import cli as compare

    assert compare.main(["--help"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("usage: ") and "--reference-from-scratch" in captured.out and captured.err == ""
