"""Check a model from your own tests: the reference, DTensor on each mesh and MirroredStrategy, judged.

    from dtensor_vs_mirrored.shared.api import check_model
    result = check_model("examples/my_model.py:my_model", meshes=("batch=8", "batch=2,model=4"),
                         epochs=2, train_examples=512, test_examples=256)
    assert result.ok, result.summary()

`model` is anything `--model` takes (mlp, vit, gpt, FILE.py:FUNCTION), or a ModelDefinition, a built Keras model,
or a function returning either (or a Keras model and its LayoutMap; called after the run's seed is set), trained in
this process then: a trainer process could not import it. The reference trains once; DTensor once per mesh and
MirroredStrategy once, on the first `devices` logical devices (configured here if TensorFlow has not started, CPUs
at least CHECK_CPUS of them; else the process's own must suffice). Every verdict is compare.py's: a float32
failure is rerun in float64 to tell float noise from a MISMATCH. Bad input raises UsageError (shared/errors.py)
with compare.py's one line, in check_model's terms (in_api_terms). TensorFlow's lines (its start-up, DTensor's)
stay out of your test's output unless verbose=True, whatever TF_CPP_MIN_LOG_LEVEL says.
"""

import argparse
import dataclasses
import random
import re
import sys
from typing import Callable, Dict, Optional, Sequence, Union

from dtensor_vs_mirrored.shared.console import hide_tensorflow_messages

# Where this import starts TensorFlow, its start-up lines are hidden too, as check_model hides its own: whatever
# TF_CPP_MIN_LOG_LEVEL says (a user's setting for their own code; TensorFlow's first lines ignore it anyway).
_shown_again = hide_tensorflow_messages(verbose="tensorflow" in sys.modules, environ={})
try:
    import numpy as np

    from dtensor_vs_mirrored.shared.config import BUILT_IN_MODELS, Config, option_flag
    from dtensor_vs_mirrored.shared.devices import configure_devices
    from dtensor_vs_mirrored.shared.errors import UsageError
    from dtensor_vs_mirrored.shared.judge.parity import Parity
    from dtensor_vs_mirrored.shared.judge.verdict import Verdict
    from dtensor_vs_mirrored.shared.model.definition import ModelDefinition
    from dtensor_vs_mirrored.shared.model.registry import register
    from dtensor_vs_mirrored.shared.option import int_list
    from dtensor_vs_mirrored.shared.run import children
    from dtensor_vs_mirrored.shared.run.comparison import check_config, check_trainer_options
    from dtensor_vs_mirrored.shared.run.options import python_value, type_name, value_fits
    from dtensor_vs_mirrored.shared.run.plan import Entry, RunPlan
    from dtensor_vs_mirrored.shared.run.sequence import RunResult, TrainedBy, train_and_judge
    from dtensor_vs_mirrored.shared.training.data import load_run_data
    from dtensor_vs_mirrored.shared.training.registry import SPEC_MODULES, distributed, trainer_spec
finally:
    _shown_again()

CHECK_CPUS = 8  # logical CPUs the first check makes, at least: later checks of up to 8 devices, in any order


@dataclasses.dataclass
class ModelCheck:
    model: str
    verdicts: Dict[str, Verdict]  # "dtensor batch=8", "dtensor batch=2,model=4", "mirrored" -> verdict
    parity: Dict[str, Parity]  # the same keys: the float32 (or run's dtype) figures against the reference
    errors: Dict[str, str]  # a trainer that raised: its one line
    run: RunResult  # everything compare.py would tabulate

    @property
    def ok(self) -> bool:
        return self.run.ok

    def summary(self) -> str:
        """One line per trainer: its verdict and why."""
        lines = [f"{name}: FAILED: {error}" for name, error in self.errors.items()]
        lines += [f"{name}: {verdict.line()}" for name, verdict in self.verdicts.items()]
        return "\n".join([f"model {self.model}"] + lines)


def check_model(
    model: Union[str, ModelDefinition, Callable[[], ModelDefinition], object] = "mlp",
    meshes: Sequence[str] = ("batch=8",),
    trainers: Optional[Sequence[str]] = None,
    devices: int = 8,
    data: str = "embedded",
    replica_counts: Sequence[int] = (),
    **options,
) -> ModelCheck:
    """Train `model` with the reference and each of `trainers` (default: dtensor and mirrored; mirrored with
    fit=True) and judge them: DTensor on every mesh; with fit=True (a Keras model), Keras's model.fit on one device
    as the reference and under MirroredStrategy on each of `replica_counts` (default: `devices`), keyed
    "mirrored" or "mirrored N".

    `options` are dtensor_vs_mirrored.shared.config.Config fields: epochs, batch_size, train_examples, dtype, fit, ...
    Python's and NumPy's global random states are put back afterwards (a Keras model's function is called after
    keras.utils.set_random_seed, which seeds them); TensorFlow's and Keras's global seeds stay the run's.
    """
    states = random.getstate(), np.random.get_state()
    shown_again = hide_tensorflow_messages(bool(options.get("verbose")), environ={})
    try:
        return _check(model, meshes, trainers, devices, data, replica_counts, options)
    except UsageError as error:
        raise UsageError(in_api_terms(error)) from None
    except KeyboardInterrupt:  # Ctrl-C: no trainer process outlives the check, then the caller's interrupt
        children.stop_all()
        raise
    finally:
        shown_again()
        random.setstate(states[0])
        np.random.set_state(states[1])


def _check(model, meshes, trainers, devices, data, replica_counts, options) -> ModelCheck:
    options = check_options(options)
    if trainers is None:
        trainers = ("mirrored",) if options.get("fit") else ("dtensor", "mirrored")
    # Before anything runs an op (checking a model object does): logical devices are fixed once per process, so where
    # this check sets them up it makes at least the tutorial's 8 CPUs: later checks of up to 8 run in any order. Not
    # for DTensorDataset, which needs a mesh over every device of the process (dtensor_impl/inputs.py).
    device_type = options.get("device_type", Config().device_type)
    more = CHECK_CPUS if options.get("dtensor_input", Config().dtensor_input) != "dataset" else 0
    all_devices = configure_devices(devices, device_type, at_least=more)[:devices]
    if not isinstance(model, str):  # an object: registered in this process, where every trainer then trains
        if options.get("trainer_process", "shared") != "shared":
            raise UsageError("a model given as an object trains in this process: trainer_process='shared'")
        model = register(model, getattr(model, "__name__", "given to check_model"), options.get("seed", Config().seed))
        options = {**options, "trainer_process": "shared"}
    known = distributed(SPEC_MODULES)
    unknown = [name for name in trainers if name not in known]
    if unknown or not trainers:
        raise UsageError(f"trainers {list(trainers)}: choose from {', '.join(known)}")
    config = Config(model=model, devices=devices, data=data, quiet=True, trainers=("reference", *trainers), **options)
    check_trainer_options(config)
    entries = lineup(config, trainers, meshes, replica_counts)
    for entry in entries[1:]:
        check_config(entry.config.replace(trainers=(entry.trainer,)), all_devices)
    dataset = load_run_data(config)
    silent = lambda line: None  # noqa: E731 - the run's lines stay out of a user's test output
    train = TrainedBy(dataset, all_devices, log=print)
    run = train_and_judge(
        RunPlan(config=config, data=dataset, devices=all_devices, entries=entries, train=train, log=silent)
    )
    return ModelCheck(
        model,
        dict(run.verdicts),
        dict(run.parity),
        {name: result.error for name, result in run.results.items() if result.failed},
        run,
    )


def lineup(config: Config, trainers: Sequence[str], meshes: Sequence[str], replica_counts: Sequence[int]):
    """The reference, then each trainer's configurations: DTensor's meshes, MirroredStrategy's update mode, or
    with --fit model.fit under MirroredStrategy on each replica count."""
    entries = [Entry("reference", "reference", config)]
    for name in trainers:
        if config.fit and name == "mirrored" and replica_counts:
            entries += [Entry(f"mirrored {count}", name, config.replace(devices=count)) for count in replica_counts]
            continue
        entries += [
            Entry(variant.key, name, variant.config)
            for variant in trainer_spec(name).variants(config, config.devices, False, meshes)
        ]
    return entries


def check_options(options: dict) -> dict:
    """`options` as Config takes them (a NumPy number as Python's), each a Config field of a value its type takes;
    else UsageError, one line naming the option."""
    fields = {field.name for field in dataclasses.fields(Config)}
    for name, value in options.items():
        if name == "mesh":
            raise UsageError(f"mesh={value!r}: give the meshes as check_model's own argument, meshes=({value!r},)")
        if name == "quiet":
            raise UsageError("quiet: check_model always runs quietly; drop it")
        if name not in fields:
            raise UsageError(
                f"{name}={value!r}: check_model has no such option; "
                "use a field of dtensor_vs_mirrored.shared.config.Config"
            )
        if not value_fits(name, value):
            raise UsageError(f"{name}={value!r}: {name} takes {type_name(name)}")
    return {name: python_value(value) for name, value in options.items()}


def in_api_terms(error: UsageError) -> str:
    """The error's line in check_model's terms: a field's as `argument train_examples: ...`; a message without one,
    which names compare.py's flags itself, with its options renamed as check_model's arguments (_named_in_api)."""
    if error.field:
        return f"argument {error.field}: {error.message}"
    return _named_in_api(error.message)


def _named_in_api(message: str) -> str:
    """compare.py's message with its options named as check_model's arguments: `--train-examples 5000` becomes
    `train_examples=5000`, `--data /no/dir:` `data=/no/dir:` (a value: _parses; else the name alone, `--restore
    starts` `restore starts`), `--mesh batch=3` `meshes entry batch=3`, a switch `--shard-weights`
    `shard_weights=True`."""
    fields = {option_flag(field.name): field for field in dataclasses.fields(Config)}

    def named(match: re.Match) -> str:
        field, value = fields.get(match.group(1)), match.group(2)
        if field is None:
            return match.group(0)
        name = "meshes entry" if field.name == "mesh" else field.name
        if isinstance(field.default, bool):
            return f"{name}={not field.default}" + (f" {value}" if value else "")
        if value is not None and _parses(field, value):
            return f"{name}{' ' if field.name == 'mesh' else '='}{value}"
        return name + (f" {value}" if value else "")

    # A flag starts a word (not inside a path: /tmp/x--seed) and ends one (not --restore's); its value, if any,
    # is the next word, up to a colon, semicolon, comma or closing bracket.
    return re.sub(r"(?<![\w/.-])(--[a-z][a-z0-9-]*)(?![\w'-])(?: ([^\s:;,)]+))?", named, message)


WORD_VALUES = {"auto", "embedded", "tfds", *BUILT_IN_MODELS}  # --data's and --model's values that are words


def _parses(field: dataclasses.Field, text: str) -> bool:
    """Whether `text` after the field's flag is its value, not the message's next word."""
    choices, parse = field.metadata.get("choices"), field.metadata.get("parse")
    if choices:
        return text in choices
    if parse in (int, float, int_list):
        try:
            parse(text)
        except (ValueError, argparse.ArgumentTypeError):
            return False
        return True
    return parse is None and (text in WORD_VALUES or re.search(r"[/.=:'\"\d]", text) is not None)  # a path, a mesh
