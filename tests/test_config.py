"""One Config for the whole run: every value checked when it is made, and the rules between options where a run
starts, with the line compare.py prints, so the command line and the Python API refuse alike; and a client of
--clients gets it whole, as JSON."""

import argparse
import dataclasses
import pickle

import pytest

from dtensor_vs_mirrored.shared import cli as compare
from dtensor_vs_mirrored.shared.config import CHOICES, Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.run.options import config_from_json

REFUSED = [  # (options, the field the value is refused for, compare.py's line)
    (dict(batch_size=0), "batch_size", "argument --batch-size: 0 is not a positive integer"),
    (dict(repeat=0), "repeat", "argument --repeat: 0 is not a positive integer"),
    (dict(train_examples=0), "train_examples", "argument --train-examples: 0 is not a positive integer"),
    (dict(epochs=-1), "epochs", "argument --epochs: -1 is negative"),
    (dict(learning_rate=float("inf")), "learning_rate", "argument --learning-rate: inf is not a finite number"),
    (dict(tolerance=float("nan")), "tolerance", "argument --tolerance: nan is not a finite number"),
    (dict(learning_rate=0.0), "learning_rate", "argument --learning-rate: 0.0 is not a positive number"),
    (dict(hidden=(64, 0)), "hidden", "argument --hidden: '64,0': every value must be a positive integer"),
    (
        dict(sweep_devices=(2, 0)),
        "sweep_devices",
        "argument --sweep-devices: '2,0': every value must be a positive integer",
    ),
    (
        dict(optimizer="rmsprop"),
        "optimizer",
        "argument --optimizer: invalid choice: 'rmsprop' (choose from 'adam', 'sgd')",
    ),
]
# Refused where a Config enters a run (compare.py's flags, check_model's keywords), by the module that owns the rule:
# --trainers' names beside the registry, the rules between options in shared/run/run_options.py.
REFUSED_TOGETHER = [
    (
        dict(trainers=("reference", "nope")),
        "argument --trainers: unknown trainer nope; choose from reference,dtensor,mirrored",
    ),
    (dict(model="vit", hidden=(64,)), "--hidden sets the MLP's layers; drop it, or use --model mlp (not vit)"),
    (dict(clients=2, sweep_devices=(2,)), "--sweep-devices runs in one process; drop it, or drop --clients"),
    (dict(clients=2, export="out"), "--export with --clients 2 is not supported yet; use --clients 1"),
    (
        dict(reference_from_scratch=True),
        "--reference-from-scratch compares trainers resumed from a checkpoint "
        "with a reference trained from the initial values; give --restore PATH too",
    ),
]


def command_line(changes: dict) -> list:
    return [
        f"--{name.replace('_', '-')}"
        + ("" if value is True else "=" + (",".join(map(str, value)) if isinstance(value, tuple) else str(value)))
        for name, value in changes.items()
    ]


@pytest.mark.parametrize("changes, field, message", REFUSED)
def test_a_bad_value_is_refused_alike_by_the_config_and_the_command_line(changes, field, message, capsys):
    with pytest.raises(UsageError) as refused:
        Config(**changes)
    assert (str(refused.value), refused.value.field) == (message, field)
    with pytest.raises(UsageError) as replaced:
        Config().replace(**changes)  # replace checks too: the sweep's and the rerun's configurations
    assert str(replaced.value) == message
    assert compare.main(command_line(changes)) == 2
    line = capsys.readouterr().err.strip()
    assert line == f"compare.py: error: {message}; see --help"


@pytest.mark.parametrize("changes, message", REFUSED_TOGETHER)
def test_options_that_do_not_go_together_are_refused_where_a_run_starts(changes, message, capsys):
    from dtensor_vs_mirrored.shared.run.run_options import check_run_options
    from dtensor_vs_mirrored.shared.training.trainer_names import check_trainer_names

    config = Config(**changes)  # the options themselves: each value is one the field takes
    with pytest.raises(UsageError) as refused:
        check_trainer_names(config.trainers)
        check_run_options(config)
    assert str(refused.value) == message
    assert compare.main(command_line(changes)) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"compare.py: error: {message}") and "\n" not in line


def test_a_usage_error_carries_its_field_and_each_front_end_names_it_its_way():
    """The message says what is wrong with the value; the command line names the option by its flag, check_model
    by its keyword (shared/api.py), and a message with no field keeps the options it names itself."""
    from dtensor_vs_mirrored.shared.api import in_api_terms

    error = UsageError("0 is not a positive integer", field="train_examples")
    assert (error.message, error.field) == ("0 is not a positive integer", "train_examples")
    assert str(error) == "argument --train-examples: 0 is not a positive integer"
    assert in_api_terms(error) == "argument train_examples: 0 is not a positive integer"
    assert pickle.loads(pickle.dumps(error)).field == "train_examples"  # whole across processes
    assert in_api_terms(UsageError("--link-gbps 5 needs --profile")) == "link_gbps=5 needs profile=True"


def test_replace_checks_the_whole_new_config_and_leaves_the_old_one_as_it_was():
    """The sweep and the float64 reruns make their configurations with replace: each is a new Config, every field
    not named kept, each value checked."""
    base = Config(model="vit", epochs=3, seed=7)
    changed = base.replace(epochs=1)
    assert changed == Config(model="vit", epochs=1, seed=7) and changed is not base
    assert (base.epochs, base.model, base.seed) == (3, "vit", 7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.epochs = 1
    with pytest.raises(UsageError) as refused:
        base.replace(epochs=0)
    assert str(refused.value) == "argument --epochs: 0 trains nothing, so no step would be judged; use 1 or more"


def test_trainers_default_to_the_registrys_and_under_fit_to_those_with_a_model_fit():
    """--trainers' default (None) is filled in where a run starts, from the specs: every trainer, and with --fit
    those whose spec has a fit_trainer (Keras's model.fit has no DTensor path)."""
    from dtensor_vs_mirrored.shared.training.registry import chosen, with_trainers

    assert Config().trainers is None
    assert chosen(Config()) == ("reference", "dtensor", "mirrored")
    assert chosen(Config(fit=True, model="examples/keras_fit.py:plain")) == ("reference", "mirrored")
    assert with_trainers(Config(trainers=("mirrored",))).trainers == ("mirrored",)
    assert with_trainers(Config(fit=True)).trainers == ("reference", "mirrored")


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


def test_config_holds_the_options_and_names_no_trainer():
    """shared/config.py holds the user's options, one help each: a check that needs to know a trainer (--trainers'
    names, what --fit can train, a mesh) lives where that knowledge is, the registry, a trainer's spec or the run
    layer, and a rule between options with the module that owns it (shared/run/run_options.py)."""
    import ast
    import os

    from dtensor_vs_mirrored.shared.training.registry import SPEC_MODULES

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shared", "config.py")
    text = open(path).read()
    tree = ast.parse(text)
    named = [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in SPEC_MODULES  # a name as data; its help's words may say
    ]
    assert named == []
    assert not {"TRAINER_NAMES", "FIT_TRAINERS", "check_combinations"} & {
        getattr(node, "id", getattr(node, "name", None)) for node in ast.walk(tree)
    }
    assert len(text.splitlines()) <= 300


@pytest.mark.parametrize("changes, message", REFUSED_TOGETHER[1:])
def test_a_run_of_a_config_made_in_python_checks_the_rules_between_its_options(changes, message):
    """comparison.run, the --clients launcher and check_model all start with check_trainer_options, which holds the
    rules compare.py checks on its flags: a Config made in Python is refused alike before anything runs."""
    from dtensor_vs_mirrored.shared.run.comparison import check_trainer_options

    with pytest.raises(UsageError) as refused:
        check_trainer_options(Config(**changes))
    assert str(refused.value) == message
