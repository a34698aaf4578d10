"""One Config for the whole run: every value and combination checked when it is made, with the
line compare.py prints, so the command line and the Python API refuse alike; and a client of
--clients gets it whole, as JSON."""

import argparse
import dataclasses

import pytest

from dtensor_vs_mirrored.shared import cli as compare
from dtensor_vs_mirrored.shared.config import CHOICES, Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.run.options import config_from_json

REFUSED = [
    (dict(batch_size=0), "argument --batch-size: 0 is not a positive integer"),
    (dict(repeat=0), "argument --repeat: 0 is not a positive integer"),
    (dict(train_examples=0), "argument --train-examples: 0 is not a positive integer"),
    (dict(epochs=-1), "argument --epochs: -1 is negative"),
    (dict(learning_rate=float("inf")), "argument --learning-rate: inf is not a finite number"),
    (dict(tolerance=float("nan")), "argument --tolerance: nan is not a finite number"),
    (dict(learning_rate=0.0), "argument --learning-rate: 0.0 is not a positive number"),
    (
        dict(trainers=("reference", "nope")),
        "argument --trainers: unknown trainer nope; choose from reference,dtensor,mirrored",
    ),
    (dict(hidden=(64, 0)), "argument --hidden: '64,0': every value must be a positive integer"),
    (dict(sweep_devices=(2, 0)), "argument --sweep-devices: '2,0': every value must be a positive integer"),
    (dict(optimizer="rmsprop"), "argument --optimizer: invalid choice: 'rmsprop' (choose from 'adam', 'sgd')"),
    (dict(model="vit", hidden=(64,)), "--hidden sets the MLP's layers; drop it, or use --model mlp (not vit)"),
    (dict(clients=2, sweep_devices=(2,)), "--sweep-devices runs in one process; drop it, or drop --clients"),
    (dict(clients=2, export="out"), "--export with --clients 2 is not supported yet; use --clients 1"),
    (
        dict(reference_from_scratch=True),
        "--reference-from-scratch compares trainers resumed from a checkpoint "
        "with a reference trained from the initial values; give --restore PATH too",
    ),
]


@pytest.mark.parametrize("changes, message", REFUSED)
def test_a_bad_value_is_refused_alike_by_the_config_and_the_command_line(changes, message, capsys):
    with pytest.raises(UsageError) as refused:
        Config(**changes)
    assert str(refused.value) == message
    with pytest.raises(UsageError) as replaced:
        Config().replace(**changes)  # replace checks too: the sweep's and the rerun's configurations
    assert str(replaced.value) == message
    argv = [
        f"--{name.replace('_', '-')}"
        + ("" if value is True else "=" + (",".join(map(str, value)) if isinstance(value, tuple) else str(value)))
        for name, value in changes.items()
    ]
    assert compare.main(argv) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"compare.py: error: {message}") and "\n" not in line


def test_replace_checks_the_whole_new_config_and_leaves_the_old_one_as_it_was():
    """The sweep and the float64 reruns make their configurations with replace: each is a new Config, every field
    not named kept, checked as a whole (a value fine alone is refused beside the fields it keeps)."""
    base = Config(model="vit", epochs=3, seed=7)
    changed = base.replace(epochs=1)
    assert changed == Config(model="vit", epochs=1, seed=7) and changed is not base
    assert (base.epochs, base.model, base.seed) == (3, "vit", 7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.epochs = 1
    assert Config().replace(hidden=(64,)).hidden == (64,)  # fine for the MLP
    with pytest.raises(UsageError) as refused:
        base.replace(hidden=(64,))  # not beside the ViT it keeps
    assert str(refused.value) == "--hidden sets the MLP's layers; drop it, or use --model mlp (not vit)"


HELP_GROUPS = [  # --help's sections in order; README and docs name them alike
    "what trains where",
    "the model",
    "the training run (the same for every trainer)",
    "data",
    "how each approach distributes",
    "parity",
    "reproducibility and baselines",
    "outputs",
    "speed",
    "checkpoints and export",
    "what is printed",
]


def test_every_option_is_declared_once_on_its_config_field():
    """The parser is made from the fields: a new field without a help text and a group fails here."""
    options = dataclasses.fields(Config)  # every field is a user's option: run plumbing is RunControl's
    undeclared = [field.name for field in options if not (field.metadata.get("help") and field.metadata.get("group"))]
    assert undeclared == []
    parser = compare.build_parser()
    shown = [action for action in parser._actions if action.help not in (None, argparse.SUPPRESS)]
    assert [action.dest for action in shown if action.dest != "help"] == [field.name for field in options]
    assert [group.title for group in parser._action_groups if group.title in HELP_GROUPS] == HELP_GROUPS
    assert [field.metadata["group"] for field in options] == sorted(
        (field.metadata["group"] for field in options), key=HELP_GROUPS.index
    )  # each group's fields together, so --help's order is the fields' order


def test_every_choice_is_listed_in_help():
    text = compare.build_parser().format_help()
    for field, choices in CHOICES.items():
        assert "{" + ",".join(choices) + "}" in text, field


def test_the_flags_fill_the_config_and_a_client_gets_it_whole_as_json():
    args = compare.build_parser().parse_args(
        ["--model", "vit", "--json", "r.json", "--sweep-devices", "2,8", "--trainers", "reference,dtensor", "--verbose"]
        + ["--device-type", "gpu", "--no-explain", "--no-dtensor-nccl"]
    )
    config, result_file = compare.config_from_args(args)
    assert result_file is None
    assert (config.model, config.json, config.sweep_devices, config.trainers, config.verbose) == (
        "vit",
        "r.json",
        (2, 8),
        ("reference", "dtensor"),
        True,
    )
    assert (config.device_type, config.explain, config.dtensor_nccl) == ("GPU", False, False)
    assert compare.config_from_args(compare.build_parser().parse_args([])) == (Config(), None)
    assert config_from_json(config.to_json()) == config


def test_config_names_a_trainer_only_as_the_trainers_defaults():
    """shared/config.py holds the user's options: a check that needs to know a trainer (what --fit can train, a
    mesh) lives where that knowledge is, a trainer's spec or the run layer (shared/run/fit_options.py), so that a
    trainer's name appears here only in --trainers' defaults."""
    import ast
    import os

    from dtensor_vs_mirrored.shared.training.registry import SPEC_MODULES

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shared", "config.py")
    tree = ast.parse(open(path).read())
    defaults = {"TRAINER_NAMES", "FIT_TRAINERS"}
    allowed = {
        id(constant)
        for node in tree.body
        if isinstance(node, ast.Assign) and {getattr(target, "id", None) for target in node.targets} & defaults
        for constant in ast.walk(node.value)
    }
    named = [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in SPEC_MODULES and id(node) not in allowed
    ]
    assert named == []
