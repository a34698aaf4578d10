"""The JSON report's contract: its schema_version, and the JSON Schema file that describes it.

shared/report.schema.json (shipped with the package) describes every field; the tests validate
each report they write against it (jsonschema). MAJOR.MINOR: MINOR grows when fields are added,
MAJOR when one is renamed, removed or changes meaning; --baseline reads reports of its own MAJOR.
What changed in each version: docs/report-changelog.md.
"""

import os

SCHEMA_VERSION = "2.4"
SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.schema.json")


def major(version: str) -> int:
    """1 for "1.0"; -1 for what is not a version, so that it matches no release."""
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return -1
