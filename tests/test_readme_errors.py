"""Every row of the "Bad input" table in docs/options.md: exit code 2 and exactly one line on stderr,
which says what the table says, and nothing trained. Rows run through compare.main in this process (the
same code as the command line, without a new process's TensorFlow import); one row also runs as a
command, as a user types it."""

import os
import re
import shlex

import pytest

from tests.cli import ROOT, run_compare, run_here


def bad_input_rows():
    """(arguments, expected text) per row of the table under docs/options.md's "## Bad input"."""
    text = open(os.path.join(ROOT, "docs", "options.md")).read()
    section = text.split("## Bad input", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `compare\.py ([^`]*)` \| `([^`]*)` \|$", section, re.M)
    return [(shlex.split(arguments), expected) for arguments, expected in rows]


def test_the_options_doc_has_an_error_table():
    assert len(bad_input_rows()) >= 10


@pytest.mark.parametrize("arguments, expected", bad_input_rows(), ids=lambda value: str(value)[:40])
def test_each_bad_input_in_the_options_doc_exits_2_with_one_line(arguments, expected):
    result = run_here(*arguments)
    code, out, err = result.returncode, result.stdout, result.stderr
    assert code == 2, out[-2000:] + err[-2000:]
    lines = err.splitlines()
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("compare.py: error: ") and expected in lines[0]
    assert "epoch 1/" not in out


def test_a_bad_input_found_after_tensorflow_starts_is_one_line_from_the_command_too():
    arguments, expected = next(row for row in bad_input_rows() if row[0][:1] == ["--mesh"])
    result = run_compare(*arguments)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stderr.splitlines() == [result.stderr.splitlines()[0]] and expected in result.stderr
    assert "Traceback" not in result.stderr and "epoch 1/" not in result.stdout
    assert "epoch 1/" not in result.stdout
