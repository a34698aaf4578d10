"""Every row of the README's "Bad input" table: exit code 2 and exactly one line on stderr, which
says what the table says, and nothing trained."""

import os
import re
import shlex

import pytest

from tests.cli import ROOT, run_compare


def readme_error_rows():
    """(arguments, expected text) per row of the table under "## Bad input"."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Bad input", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `compare\.py ([^`]*)` \| `([^`]*)` \|$", section, re.M)
    return [(shlex.split(arguments), expected) for arguments, expected in rows]


def test_the_readme_has_an_error_table():
    assert len(readme_error_rows()) >= 10


@pytest.mark.parametrize("arguments, expected", readme_error_rows(), ids=lambda value: str(value)[:40])
def test_each_bad_input_in_the_readme_exits_2_with_one_line(arguments, expected):
    result = run_compare(*arguments)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("compare.py: error: ") and expected in lines[0]
    assert "epoch 1/" not in result.stdout
