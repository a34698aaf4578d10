"""The README and docs say what the code does: the CI command, the checkpoint layout and the export's
tolerance, and the header of "What a run prints"."""

import os
import re

from shared.console import LINE_WIDTH
from shared.export import LOGIT_TOLERANCE
from tests.cli import ROOT


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def test_the_ci_advice_fixes_the_data():
    """--data auto trains on tfds or on the embedded set, depending on the network: CI should not."""
    introduction = read("README.md").split("\n## ", 1)[0]
    assert "CI" in introduction and "\n    python compare.py --data embedded" in introduction
    assert "environment.data_fallback" in introduction


def test_the_checkpoint_docs_name_the_real_layout_and_the_export_tolerance():
    text = read("docs/checkpoints-and-export.md")
    named = re.findall(r"epoch-[\w.]+", text)
    assert named and all(re.fullmatch(r"epoch-(\d{4}|NNNN)(\.partial)?", name) for name in named), named
    stated = re.search(r"`LOGIT_TOLERANCE` = (\S+) ", text)
    assert stated and float(stated.group(1)) == LOGIT_TOLERANCE and "measured: identical" not in text
    assert "--reference-from-scratch" in text


def test_the_readmes_run_excerpt_starts_with_the_header_compare_prints(devices, embedded):
    from shared import report
    from shared.config import Config

    section = read("README.md").split("## What a run prints", 1)[1].split("\n## ", 1)[0]
    excerpt = [line[4:] for line in section.splitlines() if line.startswith("    ")]
    from shared.trainers import describe_runs

    config = Config(data="embedded")
    header = report.header(config, devices, embedded, describe_runs(config)).splitlines()

    def without_version(line):
        return re.sub(r"^TensorFlow \S+;", "TensorFlow ...;", line)

    assert [without_version(line) for line in excerpt[: len(header)]] == [without_version(line) for line in header]
    assert max(len(line) for line in excerpt) <= LINE_WIDTH
