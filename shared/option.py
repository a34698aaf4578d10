"""How a Config field (shared/config.py) declares its compare.py option, with option(): its help, --help group,
metavar, how the text is parsed and the check its value must pass. The checks below return what is wrong with a
value, without the option's name: UsageError's field names it, as each front end words it (shared/errors.py).
"""

import argparse
import dataclasses
import math
from typing import Callable, Optional, Tuple

from dtensor_vs_mirrored.shared.errors import UsageError

Check = Callable[[object], Optional[str]]  # a value -> None, or what is wrong with it


@dataclasses.dataclass(frozen=True)
class Group:
    """A --help group of options: the fields declared with its option() are listed under its title, in order."""

    title: str

    def option(self, default, help: str, *, kind=None, metavar=None, parse=None, flag=None, choices=None):
        """A Config field that is also a compare.py option: its help, the metavar, `kind` (one below: how the text is
        parsed and the value's check), `parse` (argparse's type for one without a check; None keeps the text),
        `flag` (default: errors.flag(name); a bool field is a switch that flips its default). `choices` are shown
        as the metavar {a,b} and checked by Config, not by argparse, so the Python API gets the same error."""
        check, metavar = (kind.check, kind.metavar or metavar) if kind else (None, metavar)
        if choices is not None:
            metavar, check = "{" + ",".join(choices) + "}", one_of(choices)
        parse = kind.parse if kind else parse
        metadata = {"help": help, "group": self.title, "metavar": metavar, "parse": parse, "flag": flag}
        return dataclasses.field(default=default, metadata={**metadata, "choices": choices, "check": check})


def name_list(text: str) -> Tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def int_list(text: str) -> Tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def positive(value) -> Optional[str]:
    return f"{value} is not a positive integer" if value is not None and value < 1 else None


def not_negative(value) -> Optional[str]:
    return f"{value} is negative" if value < 0 else None


def some_steps(epochs) -> Optional[str]:
    if epochs == 0:  # a run of no step would judge nothing and say PARITY OK
        return "0 trains nothing, so no step would be judged; use 1 or more"
    return not_negative(epochs)


def positive_number(value) -> Optional[str]:
    if value is not None and not math.isfinite(value):
        return f"{value} is not a finite number"
    return f"{value} is not a positive number" if value is not None and not value > 0 else None


def positive_integers(values) -> Optional[str]:
    if values is not None and (not values or any(value < 1 for value in values)):
        return f"{','.join(map(str, values))!r}: every value must be a positive integer"
    return None


def one_of(choices: Tuple[str, ...]) -> Check:
    def check(value) -> Optional[str]:
        if value not in choices:
            return f"invalid choice: {value!r} (choose from {', '.join(repr(choice) for choice in choices)})"
        return None

    return check


@dataclasses.dataclass(frozen=True)
class Kind:
    """How an option's text is parsed, the check its value must pass, and its metavar: COUNT("N") shows N."""

    parse: Callable[[str], object]
    check: Check
    metavar: Optional[str] = None

    def __call__(self, metavar: str) -> "Kind":
        return dataclasses.replace(self, metavar=metavar)


COUNT = Kind(int, positive)  # 1 or more; None (a default) passes
NATURAL = Kind(int, not_negative)
EPOCHS = Kind(int, some_steps)
POSITIVE = Kind(float, positive_number)  # finite and above 0
COUNTS = Kind(int_list, positive_integers)  # 1,2,4


def check_values(config) -> None:
    """Every field's value by its check, in the fields' order: UsageError naming the first field refused."""
    for field in dataclasses.fields(config):
        wrong = field.metadata["check"] and field.metadata["check"](getattr(config, field.name))
        if wrong:
            raise UsageError(wrong, field=field.name)
