"""One Config for the whole run: every value and combination checked when it is made, with the
line compare.py prints, so the command line and the Python API refuse alike; and a client of
--clients gets it whole, as JSON."""

import dataclasses

import pytest

import compare
from shared.config import CHOICES, Config
from shared.errors import UsageError

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
    assert Config().replace  # a good one is made
    with pytest.raises(UsageError):
        Config().replace(**changes)  # replace checks too: the sweep's and the rerun's configurations
    argv = [
        f"--{name.replace('_', '-')}"
        + ("" if value is True else "=" + (",".join(map(str, value)) if isinstance(value, tuple) else str(value)))
        for name, value in changes.items()
    ]
    assert compare.main(argv) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"compare.py: error: {message}") and "\n" not in line


def test_every_field_is_a_flag_and_every_choice_is_listed_in_help():
    parser = compare.build_parser()
    destinations = {action.dest for action in parser._actions}
    # result_file is the launcher's, in the Config it hands a client (--client-config), not a flag
    assert {field.name for field in dataclasses.fields(Config)} - {"result_file"} <= destinations
    text = parser.format_help()
    for field, choices in CHOICES.items():
        assert "{" + ",".join(choices) + "}" in text, field


def test_the_flags_fill_the_config_and_a_client_gets_it_whole_as_json():
    args = compare.build_parser().parse_args(
        ["--model", "vit", "--json", "r.json", "--sweep-devices", "2,8", "--trainers", "reference,dtensor", "--verbose"]
    )
    config = compare.config_from_args(args)
    assert (config.model, config.json, config.sweep_devices, config.trainers, config.verbose) == (
        "vit",
        "r.json",
        (2, 8),
        ("reference", "dtensor"),
        True,
    )
    assert Config.from_json(config.to_json()) == config
