"""The README and docs say what the code does: the CI command, the checkpoint layout and the export's
tolerance, the header of "What a run prints", and --help's groups in docs/options.md. The README stays a
first screen (at most 200 lines) that links every file of docs/, and every relative link resolves."""

import dataclasses
import os
import re

from shared.console import LINE_WIDTH
from shared.training.export import LOGIT_TOLERANCE
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
    from shared.config import Config
    from shared.report.header import header as run_header
    from shared.run.sequence import describe_processes
    from shared.training.registry import describe_runs

    section = read("README.md").split("## What a run prints", 1)[1].split("\n## ", 1)[0]
    excerpt = [line[4:] for line in section.splitlines() if line.startswith("    ")]
    config = Config(data="embedded")
    header = run_header(config, devices, embedded, describe_runs(config), describe_processes(config)).splitlines()

    def without_version(line):
        return re.sub(r"^TensorFlow \S+;", "TensorFlow ...;", line)

    assert [without_version(line) for line in excerpt[: len(header)]] == [without_version(line) for line in header]
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
    import compare

    own = {"positional arguments", "options", "optional arguments"}  # argparse's, not ours
    titles = [group.title for group in compare.build_parser()._action_groups if group.title not in own]
    assert [group for group, _ in documented_option_groups()] == titles


def test_the_options_doc_puts_every_option_in_its_group_of_help():
    """Each option the doc names is one of its --help group's; each visible option of a group is named."""
    import argparse

    import compare

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
    from shared.training.protocol import Cluster, Trainer, TrainerSpec

    trainer_parts = set(Trainer.__annotations__) | {
        name for name, value in vars(Trainer).items() if callable(value) and not name.startswith("_")
    }
    assert sorted(documented_parts("a trainer is a `Trainer`")) == sorted(trainer_parts)
    spec_fields = [field.name for field in dataclasses.fields(TrainerSpec)]
    assert documented_parts("Each trainer package registers a `TrainerSpec`") == spec_fields
    assert documented_parts("its `Cluster`") == [field.name for field in dataclasses.fields(Cluster)]
