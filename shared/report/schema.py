"""The JSON report's contract: its schema_version, and the JSON Schema file that describes it.

shared/report.schema.json (shipped with the package) describes every field; the tests validate
each report they write against it (jsonschema). MAJOR.MINOR: MINOR grows when fields are added,
MAJOR when one is renamed, removed or changes meaning; --baseline reads reports of its own MAJOR.
What changed in each version: docs/report-changelog.md.
"""

import functools
import json
import os
from typing import Optional

SCHEMA_VERSION = "2.7"
SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.schema.json")


def major(version: str) -> int:
    """1 for "1.0"; -1 for what is not a version, so that it matches no release."""
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return -1


# What --baseline reads of a report of another MINOR, whose fields may be fewer (older) or more (newer):
# the rest of the schema holds for the fields present.
BASELINE_READS = {
    "required": ["schema_version", "config", "environment", "trainers"],
    "trainer": ["failed", "step_losses"],
    "failed_trainer": ["failed"],
}


@functools.lru_cache(maxsize=None)
def schema() -> dict:
    with open(SCHEMA_PATH) as file:
        return json.load(file)


@functools.lru_cache(maxsize=None)
def _validator(this_version: bool):
    import jsonschema  # a tenth of a second to import: only a --baseline run pays it

    checked = schema() if this_version else _for_any_minor(schema())
    return jsonschema.Draft202012Validator(checked)


def schema_error(report: dict) -> Optional[str]:
    """Where and why `report` is not a report of this schema, one line; None when it is. A report of another
    MINOR of this MAJOR is held to the schema's types for the fields it has, and must have those --baseline
    reads (BASELINE_READS)."""
    version = report.get("schema_version") if isinstance(report, dict) else None
    error = _most_relevant(list(_validator(version == SCHEMA_VERSION).iter_errors(report)))
    if error is None:
        return None
    return f"at {'/'.join(map(str, error.absolute_path)) or 'the top level'}: {_said(error)}"


def _most_relevant(errors):
    """jsonschema's best match, except that of oneOf's alternatives it follows the one the value is meant to be:
    not one whose type or distinguishing constant (a trainer's `failed`) the value lacks; of several, the one
    with the fewest errors."""
    import jsonschema

    error = max(errors, key=jsonschema.exceptions.relevance, default=None)
    if error is None or not error.context:
        return error
    alternatives = {}
    for inner in error.context:
        alternatives.setdefault(inner.relative_schema_path[0], []).append(inner)
    meant = [found for found in alternatives.values() if not any(_not_this_kind(inner) for inner in found)]
    return _most_relevant(min(meant, key=len)) if meant else error  # of several, the nearest miss


def _not_this_kind(error) -> bool:
    return (error.validator == "type" and not error.relative_path) or (
        error.validator == "const" and len(error.relative_path) == 1
    )


def _said(error) -> str:
    """The error in a few words: jsonschema's message, unless it would print a whole list or object."""
    shown = json.dumps(error.instance)
    shown = shown if len(shown) <= 40 else f"a {type(error.instance).__name__}"
    if error.validator in ("required", "additionalProperties"):
        return error.message
    if error.validator == "type":
        return f"{shown} is not of type {error.validator_value!r}"
    if error.validator in ("oneOf", "anyOf"):
        return f"{shown} is of none of the types the schema allows here"
    if error.validator in ("const", "enum"):
        return f"{shown} is not {json.dumps(error.validator_value)}"
    return f"{shown} fails the schema's {error.validator} {json.dumps(error.validator_value)[:60]}"


def _for_any_minor(node):
    """The schema without the requirements that a MINOR may add (required fields, no others, this version),
    except BASELINE_READS; oneOf as anyOf, since two alternatives may then both hold."""
    if isinstance(node, list):
        return [_for_any_minor(item) for item in node]
    if not isinstance(node, dict):
        return node
    relaxed = {}
    for key, value in node.items():
        if key == "required" or (key == "additionalProperties" and value is False):
            continue
        relaxed["anyOf" if key == "oneOf" else key] = _for_any_minor(value)
    if node.get("properties", {}).get("schema_version"):  # the top level
        relaxed["properties"]["schema_version"] = {"type": "string", "pattern": rf"^{major(SCHEMA_VERSION)}\.\d+$"}
        relaxed["required"] = BASELINE_READS["required"]
    for name in ("trainer", "failed_trainer", "weight_digests"):
        if name in relaxed.get("$defs", {}):
            definition = relaxed["$defs"][name]
            if name == "weight_digests":  # every digest field: the comparison reads them all
                definition["items"]["required"] = node["$defs"][name]["items"]["required"]
            else:
                definition["required"] = BASELINE_READS[name]
    return relaxed
