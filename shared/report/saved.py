"""Reading a report that --json wrote, for --baseline: one line that says what to fix when it is not one, and
validated against the shipped schema (shared/report/schema.py) before anything compares with it."""

import json

from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.report.schema import SCHEMA_VERSION, major, schema_error


def load(path: str) -> dict:
    """The baseline report, checked enough to compare with: UsageError in one line otherwise."""
    try:
        with open(path) as file:
            report = json.load(file)
    except FileNotFoundError:
        raise UsageError(f"--baseline {path}: no such file; give a report that compare.py --json wrote") from None
    except (OSError, ValueError) as error:
        raise UsageError(f"--baseline {path}: not a JSON report ({str(error).splitlines()[0]})") from None
    if not isinstance(report, dict) or not {"config", "environment", "trainers"} <= set(report):
        raise UsageError(f"--baseline {path}: not a compare.py report (no config, environment and trainers)")
    version = report.get("schema_version")
    if version is None:
        raise UsageError(
            f"--baseline {path}: written before reports had a schema_version; save it again with "
            f"this compare.py (schema {SCHEMA_VERSION})"
        )
    if major(version) != major(SCHEMA_VERSION):
        raise UsageError(
            f"--baseline {path}: schema_version {version}, this compare.py reads {major(SCHEMA_VERSION)}.x "
            f"(docs/report-changelog.md); save it again with this compare.py"
        )
    error = schema_error(report)
    if error:
        raise UsageError(
            f"--baseline {path}: not a report of schema {version} {error}; save it again with this compare.py"
        )
    return report
