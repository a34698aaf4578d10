"""The README and docs say what the code does: the CI command, the checkpoint layout and the export's
tolerance, the header of "What a run prints", --help's groups in docs/options.md, the numeric options in
docs/baselines.md, the network lines in docs/multi-machine.md, and every message a doc quotes is one a test
expects (below); no doc gives a source file's line count. The README stays a first screen (at most 200
lines) that links every file of docs/, and every relative link resolves."""

import ast
import dataclasses
import functools
import os
import re
import subprocess
import sys

from dtensor_vs_mirrored.shared.console import LINE_WIDTH
from dtensor_vs_mirrored.shared.training.export import LOGIT_TOLERANCE
from tests.cli import ROOT


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def test_the_ci_advice_fixes_the_data():
    """--data auto trains on tfds or on the embedded set, depending on the network: CI should not. The command the
    README's introduction gives parses to a run whose data does not depend on the network, and writes its report."""
    from dtensor_vs_mirrored.shared import cli as compare

    introduction = read("README.md").split("\n## ", 1)[0]
    (command,) = re.findall(r"^    python compare\.py (.*)$", introduction, re.M)
    config, _ = compare.config_from_args(compare.build_parser().parse_args(command.split()))
    assert config.data != "auto" and config.json


def compare_parser():
    from dtensor_vs_mirrored.shared import cli as compare

    return compare.build_parser()


def test_the_checkpoint_docs_name_the_real_layout_and_the_export_tolerance():
    """The epoch directories as the code names them, its export tolerance, and only options compare.py has."""
    text = read("docs/checkpoints-and-export.md")
    named = re.findall(r"epoch-[\w.]+", text)
    assert named and all(re.fullmatch(r"epoch-(\d{4}|NNNN)(\.partial)?", name) for name in named), named
    stated = re.search(r"`LOGIT_TOLERANCE` = (\S+) ", text)
    assert stated and float(stated.group(1)) == LOGIT_TOLERANCE
    options = {option for action in compare_parser()._actions for option in action.option_strings}
    named = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", text))
    assert {"--checkpoint-dir", "--restore", "--export"} <= named and named - options == set()


def test_the_readmes_run_excerpt_starts_with_the_header_compare_prints(devices, embedded):
    from dtensor_vs_mirrored.shared.config import Config
    from dtensor_vs_mirrored.shared.report.header import header as run_header
    from dtensor_vs_mirrored.shared.run.sequence import describe_processes
    from dtensor_vs_mirrored.shared.training.registry import describe_runs

    section = read("README.md").split("## What a run prints", 1)[1].split("\n## ", 1)[0]
    excerpt = [line[4:] for line in section.splitlines() if line.startswith("    ")]
    config = Config(data="embedded")
    header = run_header(config, devices, embedded, describe_runs(config), describe_processes(config)).splitlines()

    def without_machine(lines):
        """The lines as one text, without what differs by machine: the release, the cores and the CPU's name."""
        text = re.sub(r"^TensorFlow \S+(, Keras \S+)?;", "TensorFlow ...;", " ".join(" ".join(lines).split()))
        return re.sub(r"sharing \d+ cores( \(.*?\))?:", "sharing N cores:", text)

    assert without_machine(excerpt).startswith(without_machine(header))
    assert "speeds: 8 logical CPUs sharing" in without_machine(header)
    assert max(len(line) for line in excerpt) <= LINE_WIDTH


README_MAX_LINES = 200


def test_the_readme_is_a_first_screen_that_links_every_doc():
    readme = read("README.md")
    assert len(readme.splitlines()) <= README_MAX_LINES, "move tables and findings to docs/ (STYLE.md 14)"
    docs = sorted(name for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
    assert [name for name in docs if f"](docs/{name})" not in readme] == []


def test_every_relative_link_in_the_readme_and_docs_resolves():
    pages = ["README.md"] + [f"docs/{name}" for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md")]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", read(page)):
            path = target.split("#", 1)[0]
            if path and not re.match(r"[a-z]+:", path):
                if not os.path.exists(os.path.join(ROOT, os.path.dirname(page), path)):
                    broken.append(f"{page}: {target}")
    assert broken == []


def documented_option_groups():
    """(group, options) per row of docs/options.md's "## Groups" table, in its order."""
    section = read("docs/options.md").split("\n## Groups", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|`]+?) \| (.+) \|$", section, re.M)
    return [(group, re.findall(r"`(--[a-z][\w-]*)", options)) for group, options in rows if group != "group"]


def test_the_options_doc_has_the_groups_of_help_in_its_order():
    from dtensor_vs_mirrored.shared import cli as compare

    own = {"positional arguments", "options", "optional arguments"}  # argparse's, not ours
    titles = [group.title for group in compare.build_parser()._action_groups if group.title not in own]
    assert [group for group, _ in documented_option_groups()] == titles


def test_the_options_doc_puts_every_option_in_its_group_of_help():
    """Each option the doc names is one of its --help group's; each visible option of a group is named."""
    import argparse

    from dtensor_vs_mirrored.shared import cli as compare

    parser_groups = {
        group.title: [action for action in group._group_actions if action.help != argparse.SUPPRESS]
        for group in compare.build_parser()._action_groups
    }
    for group, documented in documented_option_groups():
        actions = parser_groups.get(group, [])
        options = {option for action in actions for option in action.option_strings}
        assert set(documented) <= options, (group, sorted(set(documented) - options))
        unnamed = [action.option_strings for action in actions if not set(action.option_strings) & set(documented)]
        assert unnamed == [], (group, unnamed)


def documented_parts(title: str) -> list:
    """The part names in the first column of the docs/trainers.md table that follows the line naming `title`."""
    text = read("docs/trainers.md")
    table = text[text.index(title) :].split("\n\n| part |", 1)[1].split("\n\n", 1)[0]
    names = []
    for row in table.splitlines()[2:]:
        names += re.findall(r"`(\w+)", row.split("|")[1])
    return names


def test_the_trainer_contract_in_the_docs_is_the_one_in_the_code():
    from dtensor_vs_mirrored.shared.training.protocol import Cluster, Trainer, TrainerSpec

    trainer_parts = set(Trainer.__annotations__) | {
        name for name, value in vars(Trainer).items() if callable(value) and not name.startswith("_")
    }
    assert sorted(documented_parts("a trainer is a `Trainer`")) == sorted(trainer_parts)
    spec_fields = [field.name for field in dataclasses.fields(TrainerSpec)]
    assert documented_parts("Each trainer package registers a `TrainerSpec`") == spec_fields
    assert documented_parts("its `Cluster`") == [field.name for field in dataclasses.fields(Cluster)]


# --- every message a doc quotes is one the tests expect ----------------------------------------------------------
#
# A quoted message is an inline code span of four words or more in the README or docs/ (and an indented line that
# starts with "compare.py: error:"), except commands, formulas and code, and other programs' own lines (TensorFlow's,
# quoted in docs/releases.md). Each must be a run of a string that some test expects (tests/, examples/test_*.py;
# not this file): its literal text, where a test's f-string value or regex wildcard stands for one value and the
# quote's `...`, placeholder letter (step k, N steps), <name> or number stand for any. So a doc that quotes a line the
# code no longer prints fails here until a test expects that line.

COMMAND = re.compile(r"^(python3? |\.venv|\.nox|pip |pytest|nox |ruff |export |git |unshare |--|compare\.py(?!:)|\w+=)")
OTHER_PROGRAMS = re.compile(r"^'tf\.|^\w*Error: ")  # TensorFlow's and tensorflow-datasets' own lines
# |diff| <= T, atol = rtol = T, (a, b) -> ..., f(x), (x, y), from m import n
CODE = re.compile(r"\||<=|\s=\s|->|^[\w.]+\(|^\(|^from [\w.]+ import ")
PLACEHOLDER = r"\.\.\.|\b[kNABDxy]\b|<[^<>]+>"
NUMBER = r"\d+(?:[.,]\d+)*(?:e[-+]?\d+)?"
WILD, NUM = "\x10", "\x11"  # in a quote: any text; a number
WORD, ANY, DIGITS = "\x12", "\x13", "\x14"  # in a test's string: an f-string's value, a regex's .* and its \d+
REGEX_HOLES = [
    (re.compile(r"\.[*+]\??"), ANY),
    (re.compile(r"\\d[+*]\??"), DIGITS),
    (re.compile(r"\\[Sw][+*]\??"), WORD),
    (re.compile(r"\[\^?[^\]]*\][+*]\??"), WORD),
]
NUMBER_CHARACTERS = set("0123456789.,e-+")
# Of a quote's own characters, at least this share must be a test's literal text: a test's string that is mostly
# values ("compare.py: error: {path}: {message}") then vouches for no quote (0.5 did, for a stale one's tail).
SHARE_LITERAL = 0.6


def doc_pages() -> list:
    return ["README.md"] + sorted(
        f"docs/{name}" for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md")
    )


def quoted_messages(page: str):
    """(page, quote) for each message `page` quotes, whitespace collapsed."""
    text = re.sub(r"^```.*?^```", "", read(page), flags=re.S | re.M)
    for paragraph in re.split(r"\n\s*\n", text):
        prose = "\n".join(line for line in paragraph.split("\n") if not line.startswith("    "))
        for span in re.findall(r"`([^`]+)`", prose):
            quote = " ".join(span.replace("\\|", "|").split())
            command = COMMAND.match(quote) and ": " not in quote  # `--data x.npz: no such file` is a message
            if len(quote.split()) >= 4 and not (command or OTHER_PROGRAMS.match(quote) or CODE.search(quote)):
                yield page, quote
        for line in paragraph.split("\n"):
            if re.match(r"    compare\.py: (internal )?error: ", line):
                yield page, " ".join(line.split())


def _without_regex(text: str) -> str:
    """A test's regex as the text it matches, its wildcards as holes; other text as it is."""
    if not re.search(r"\\[.()\[\]dSsw+*?|{}^$]", text):
        return text
    for pattern, hole in REGEX_HOLES:
        text = pattern.sub(hole, text)
    return re.sub(r"\\(.)", r"\1", text).replace("^", "").replace("$", "")


def _string(node):
    """A string a test writes: a literal, an f-string (each value a hole) or a sum of them; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _without_regex(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(_without_regex(v.value) if isinstance(v, ast.Constant) else WORD for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string(node.left), _string(node.right)
        return None if left is None or right is None else left + right
    return None


@functools.lru_cache(maxsize=None)
def expected_strings() -> tuple:
    paths = [f"tests/{name}" for name in os.listdir(os.path.join(ROOT, "tests")) if name.endswith(".py")]
    paths += [f"examples/{name}" for name in os.listdir(os.path.join(ROOT, "examples")) if name.startswith("test_")]
    found = set()
    for path in paths:
        if path == "tests/test_docs.py":  # its own strings would expect themselves
            continue
        for node in ast.walk(ast.parse(read(path))):
            text = _string(node)
            if text and len(text) > 10:
                found.add(" ".join(text.split()))
    return tuple(sorted(found))


def _items(quote: str) -> str:
    parts = re.split(f"({PLACEHOLDER}|{NUMBER})", quote)
    return "".join(
        WILD if re.fullmatch(PLACEHOLDER, part) else NUM if re.fullmatch(NUMBER, part) else part for part in parts
    )


def quote_in(quote: str, expected: str) -> bool:
    """Whether `quote` (its _items) is a run of `expected`: a hole of `expected` takes any text of one clause (no
    ';'), DIGITS a number; at least SHARE_LITERAL of the quote's own characters are `expected`'s literally."""
    failed = -1

    @functools.lru_cache(maxsize=None)
    def best(i, j):  # the most literal characters matched with quote[i:] from expected[j:]; `failed` if none
        if i == len(quote):
            return 0
        if quote[i] == WILD:
            return max(best(i + 1, j), best(i, j + 1) if j < len(expected) else failed)
        if j == len(expected):
            return failed
        if expected[j] in (WORD, ANY, DIGITS):  # a hole: empty, or it takes quote[i] and perhaps more
            empty = best(i, j + 1)
            if quote[i] == NUM or (expected[j] != DIGITS and quote[i] != ";"):
                return max(empty, best(i + 1, j + 1), best(i + 1, j))
            return empty
        if quote[i] == NUM:
            found, k = failed, j
            while k < len(expected) and expected[k] in NUMBER_CHARACTERS:
                k += 1
                found = max(found, best(i + 1, k))
            return found
        rest = best(i + 1, j + 1) if quote[i] == expected[j] else failed
        return failed if rest == failed else rest + 1

    literal = sum(1 for character in quote if character not in (WILD, NUM))
    return max(best(0, j) for j in range(len(expected))) >= literal * SHARE_LITERAL


def expected_by_a_test(quote: str) -> bool:
    """Whether a test expects `quote`: one of its strings, or a row of docs/options.md's bad-input table (each
    row's command is run by tests/test_readme_errors.py, which checks its line)."""
    from tests.test_readme_errors import bad_input_rows

    if any(quote in expected for _, expected in bad_input_rows()):
        return True
    items, words = _items(quote), re.findall(r"[A-Za-z]{5,}", quote)
    candidates = [text for text in expected_strings() if not words or any(word in text for word in words)]
    return any(quote_in(items, text) for text in candidates)


def test_the_quote_matcher_tells_a_quoted_line_from_a_stale_one():
    expected = "its forward raised KeyError: 'dense/b' (user_model.py:6) on inputs [2, 784] float32"
    assert quote_in(
        _items("its forward raised KeyError: 'dense/b' (user_model.py:9) on inputs [2, 784] float32"), expected
    )
    assert quote_in(
        _items("at step k: loss A, baseline B (diff D)"), f"at step {WORD}: loss {WORD}, baseline 2 (diff 1)"
    )
    assert not quote_in(_items("its forward raised KeyError: 'dense/b' (user_model.py:6) on 2 images"), expected)
    assert not quote_in(_items("a whole sentence that the test does not write"), f"| ({WORD}) | ({ANY}) |")
    mostly_values = f"compare.py: error: --data {WORD}: {WORD}"
    assert not quote_in(_items("compare.py: error: --data x.npz: no such file, or another line"), mostly_values)


def test_every_message_a_doc_quotes_is_one_a_test_expects():
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))  # the matcher recurses once per character
    unexpected = [f"{page}: {quote}" for page in doc_pages() for _, quote in quoted_messages(page)]
    unexpected = [entry for entry in unexpected if not expected_by_a_test(entry.split(": ", 1)[1])]
    assert unexpected == []


def test_the_baselines_doc_lists_the_numeric_options_that_the_baseline_judge_declares():
    from dtensor_vs_mirrored.shared.config import flag
    from dtensor_vs_mirrored.shared.judge.baseline import NUMERIC_OPTIONS

    paragraph = read("docs/baselines.md").split("`shared/judge/baseline.NUMERIC_OPTIONS`: ", 1)[1].split(";", 1)[0]
    assert re.findall(r"`(--[\w-]+)`", paragraph) == [flag(name) for name in NUMERIC_OPTIONS]


def test_no_doc_gives_a_source_files_line_count():
    """Line counts go stale with the next commit and say nothing a reader needs."""
    counted = re.compile(r"\.py`?\s+\d+\s*->\s*\d+|\b\d[\d,]* (?:source )?lines (?:of|in)\b")
    assert [page for page in doc_pages() if counted.search(read(page))] == []


def test_the_multi_machine_doc_shows_the_network_lines_the_launcher_prints():
    from dtensor_vs_mirrored.shared.console import fit_width
    from dtensor_vs_mirrored.shared.run.network import PrivateNetwork

    private, refused = PrivateNetwork(), PrivateNetwork()
    private.holder = object()  # a namespace is held: its pid is not shown
    refused.why_not = "unshare: unshare failed: Operation not permitted"
    text = read("docs/multi-machine.md")
    for network in (private, refused):
        shown = "\n".join("    " + line for line in fit_width(network.describe(), indent=2).splitlines())
        assert shown in text, shown


# A measurement in the docs is marked: a paragraph that says "Measured", or a section whose heading says
# "measured" or "Measurements". Each names the commit its figures come from and the machine.
COMMIT = re.compile(r"\bcommits? ([0-9a-f]{7,40})\b")
MACHINE = re.compile(r"2-core|2 cores|AMD EPYC|GPU")


def measured_passages() -> list:
    """(page, the passage's first line, its text) for each marked measurement."""
    passages = []
    for page in doc_pages():
        for section in re.split(r"\n(?=## )", read(page)):
            heading = section.split("\n", 1)[0]
            if heading.startswith("## ") and re.search(r"[Mm]easured|Measurements", heading):
                passages.append((page, heading, section))
                continue
            passages += [
                (page, paragraph.strip().split("\n")[0], paragraph)
                for paragraph in re.split(r"\n\s*\n", section)
                if re.search(r"\bMeasured\b", paragraph) and not paragraph.startswith("    ")
            ]
    return passages


def known_commit(commit: str) -> bool:
    """Whether git knows `commit` here (True where there is no history to ask: an unpacked source tree, or a
    shallow clone, which holds the newest commits only)."""
    try:
        done = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
        shallow = subprocess.run(
            ["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return True
    return done.returncode == 0 or shallow == "true" or not os.path.exists(os.path.join(ROOT, ".git"))


def test_every_measurement_in_the_docs_names_its_commit_and_machine():
    passages = measured_passages()
    assert len(passages) >= 10
    unnamed = [
        f"{page}: {first}" for page, first, text in passages if not (COMMIT.search(text) and MACHINE.search(text))
    ]
    assert unnamed == []
    unknown = [commit for _, _, text in passages for commit in COMMIT.findall(text) if not known_commit(commit)]
    assert unknown == []


def test_the_readmes_test_counts_are_the_ones_pytest_collects(pytestconfig):
    """ "N tests ... the K heavier end-to-end runs": pytest's own count of the default selection (every test
    not marked extended, pyproject.toml's addopts) and of `-m extended`, so that the README's numbers move
    with the suite: this session's own collection where it collected the whole suite (tests/conftest.py), else one
    collection, `-m extended`, that selects K of all of them."""
    said = re.search(r"(\d+) tests in\s.*?`pytest -m\s+extended` the (\d+) heavier", read("README.md"), re.S)
    assert said, "the README's test command no longer says how many tests it runs"
    assert "-m 'not extended'" in read("pyproject.toml")
    if hasattr(pytestconfig, "suite_counts"):  # this session collected the whole suite (tests/conftest.py)
        everything, extended = pytestconfig.suite_counts
        assert (int(said.group(1)), int(said.group(2))) == (everything - extended, extended)
        return
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"]
    output = subprocess.run(command + ["-m", "extended"], cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
    found = re.search(r"(\d+)/(\d+) tests collected", output)
    assert found, output[-500:]
    extended, everything = int(found.group(1)), int(found.group(2))
    assert (int(said.group(1)), int(said.group(2))) == (everything - extended, extended)
