"""The user's options as they cross a boundary: a Config from JSON (what the --clients launcher hands a client,
shared/run/clients.py) and a Python value judged against a field's declared type (check_model's keywords,
shared/api.py). The types are read from Config's annotations, so a new field needs nothing here; Config itself
then judges the value (shared/config.py)."""

import dataclasses
import json
import numbers
import typing

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError


def _holds_a_tuple(declared) -> bool:
    return typing.get_origin(declared) is tuple or any(_holds_a_tuple(part) for part in typing.get_args(declared))


TUPLE_FIELDS = {field.name for field in dataclasses.fields(Config) if _holds_a_tuple(field.type)}  # JSON has lists


def config_from_json(text: str) -> Config:
    """The Config that Config.to_json wrote; UsageError in one line for text that is not one."""
    fields = _json_fields(text)
    return Config(
        **{
            name: tuple(value) if name in TUPLE_FIELDS and value is not None else value
            for name, value in fields.items()
        }
    )


def _json_fields(text: str) -> dict:
    """Config.to_json's object, its every key a field of this Config: UsageError otherwise (another version's
    file, a hand-edited one)."""
    try:
        fields = json.loads(text)
    except ValueError as error:
        raise UsageError(f"not a configuration in JSON ({error})") from None
    if not isinstance(fields, dict):
        raise UsageError(f"not a configuration in JSON (a {type(fields).__name__}, not an object)")
    known = {field.name for field in dataclasses.fields(Config)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise UsageError(
            f"unknown configuration field {unknown[0]!r}; it was written by another version of compare.py: "
            f"write it again with this one"
        )
    wrong = [name for name, value in fields.items() if not _json_type_fits(name, value)]
    if wrong:
        raise UsageError(f"configuration field {wrong[0]!r} is {fields[wrong[0]]!r}, not a value that field takes")
    return fields


def _json_type_fits(name: str, value) -> bool:
    """Whether a JSON value has the field's declared type (a list for a tuple); Config then judges the value."""
    return _fits(_field(name).type, value)


def value_fits(name: str, value) -> bool:
    """Whether a Python value has field `name`'s declared type (a tuple or a list for a tuple, a NumPy integer for
    an int): the Python API's options (shared/api.py); Config then judges the value."""
    value = python_value(value)
    return _json_type_fits(name, list(value) if isinstance(value, tuple) else value)


def python_value(value):
    """A NumPy integer or real as Python's int or float (a bool stays); anything else as it is."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def type_name(name: str) -> str:
    """Field `name`'s declared type in words, e.g. "an int", "a float or None", "a tuple of int"."""
    return _type_words(_field(name).type)


def _type_words(declared) -> str:
    origin, arguments = typing.get_origin(declared), typing.get_args(declared)
    if origin is typing.Union:
        return " or ".join(_type_words(argument) for argument in arguments)
    if origin is tuple:
        return f"a tuple of {arguments[0].__name__}"
    if declared is type(None):
        return "None"
    return f"{'an' if declared.__name__[0] in 'aeiou' else 'a'} {declared.__name__}"


def _fits(declared, value) -> bool:
    origin, arguments = typing.get_origin(declared), typing.get_args(declared)
    if origin is typing.Union:
        return any(_fits(argument, value) for argument in arguments)
    if origin is tuple:
        return isinstance(value, list) and all(_fits(arguments[0], item) for item in value)
    if declared is type(None):
        return value is None
    if declared is bool or isinstance(value, bool):
        return declared is bool and isinstance(value, bool)
    if declared is float:
        return isinstance(value, (int, float))
    return isinstance(value, declared)


def _field(name: str) -> dataclasses.Field:
    return next(field for field in dataclasses.fields(Config) if field.name == name)
