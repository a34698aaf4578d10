"""The JSON report's contract: schema_version, shared/report/report.schema.json, docs/report-changelog.md.

Every report the suite writes is validated against the schema where it is written
(tests/cli.py's run_compare, and check_report for reports made in process); this file checks
the schema itself: that it is one, that it ships, and that it rejects what broke users before.
"""

import copy
import dataclasses
import json
import os
import re

import jsonschema
import pytest

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.report.schema import SCHEMA_PATH, SCHEMA_VERSION, major
from tests.cli import ROOT, check_report

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def schema():
    with open(SCHEMA_PATH) as file:
        return json.load(file)


def minimal_report():
    """The smallest report compare.py could write: no trainer finished, nothing optional."""
    return json.loads(
        json.dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "ok": False,
                "config": dataclasses.asdict(Config(trainers=("reference",))),  # a run names its trainers
                "environment": {
                    "tensorflow": "2.21.0",
                    "keras": "3.15.1",
                    "data_source": "embedded",
                    "data_reason": "--data embedded",
                    "devices": ["CPU:0"],
                    "train_examples": 4000,
                    "test_examples": 1000,
                    "data_sha256": "0" * 64,
                    "op_determinism": False,
                    "data_fallback": None,
                    "machine": {
                        "device_type": "CPU",
                        "logical_devices": 8,
                        "physical_devices": 1,
                        "cores": 2,
                        "name": "",
                        "speeds_transfer": False,
                        "line": "speeds: 8 logical CPUs sharing 2 cores: ...",
                    },
                },
                "trainers": {"reference": {"failed": True, "error": "RuntimeError: x", "traceback": "Traceback ..."}},
                "parity": {},
                "float64_rerun": None,
                "reproducibility": None,
                "baseline": None,
                "model": {
                    "name": "mlp 784-10",
                    "description": "",
                    "parameters": 7850,
                    "flops_per_example": 47040,
                    "variables": [
                        {"name": "layers/0/w", "shape": [784, 10], "layout": []},
                        {"name": "layers/0/b", "shape": [10], "layout": []},
                    ],
                },
                "compute": {
                    "flops_per_example": 5422800,
                    "matmul_peak_gflops": 80.0,
                    "matmul_peak_dtype": "float32",
                    "achieved_gflops": {},
                    "yardstick_gflops": 80.0,
                    "yardstick": "matmul",
                },
            }
        )
    )


def test_the_schema_is_a_json_schema_of_this_version():
    jsonschema.Draft202012Validator.check_schema(schema())
    assert schema()["properties"]["schema_version"] == {"const": SCHEMA_VERSION}
    assert major(SCHEMA_VERSION) >= 1 and major("nonsense") == -1


def test_the_schema_ships_with_the_package():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as file:
        package_data = tomllib.load(file)["tool"]["setuptools"]["package-data"]["dtensor_vs_mirrored.shared.report"]
    assert os.path.basename(SCHEMA_PATH) in package_data
    assert os.path.dirname(SCHEMA_PATH).endswith(os.path.join("shared", "report"))  # tests/test_packaging.py: the wheel


def test_the_schema_knows_every_config_field():
    """A field added to Config without the schema would make every report fail validation: this names it."""
    assert set(dataclasses.asdict(Config())) <= set(schema()["$defs"]["config"]["properties"])


def test_the_schema_names_the_registered_trainers():
    """The trainers' names are the registry's: a trainer registered without the schema fails here."""
    from dtensor_vs_mirrored.shared.training.registry import SPEC_MODULES, distributed

    assert schema()["$defs"]["trainer_name"]["enum"] == list(SPEC_MODULES)
    assert schema()["$defs"]["sweep_entry"]["properties"]["trainer"]["enum"] == distributed(list(SPEC_MODULES))


def test_the_changelog_has_this_version_names_the_schema_and_the_readme_links_it():
    changelog = open(os.path.join(ROOT, "docs", "report-changelog.md")).read()
    assert re.search(rf"^## {re.escape(SCHEMA_VERSION)}\b", changelog, re.M)
    schema_file = os.path.relpath(SCHEMA_PATH, ROOT).replace(os.sep, "/")
    assert "`schema_version`" in changelog and f"`{schema_file}`" in changelog, schema_file
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "](docs/report-changelog.md)" in readme


def test_a_minimal_report_validates():
    check_report(minimal_report())


@pytest.mark.parametrize(
    "change, where",
    [
        (lambda r: r.pop("schema_version"), "'schema_version' is a required property"),
        (lambda r: r.update(schema_version="0.9"), f"'{SCHEMA_VERSION}' was expected"),
        (lambda r: r.update(unknown_field=1), "Additional properties are not allowed ('unknown_field' was unexpected)"),
        (lambda r: r["config"].pop("seed"), "'seed' is a required property"),
        (lambda r: r["environment"].update(data_sha256="abc"), "'abc' does not match"),
        # Issue 12 renamed parity.<trainer>.tolerance (a number) to tolerances; a report with the old key fails.
        (lambda r: r["parity"].update(dtensor={"tolerance": 1e-4}), "Additional properties are not allowed"),
    ],
)
def test_the_schema_rejects_a_report_that_breaks_the_contract(change, where):
    report = copy.deepcopy(minimal_report())
    change(report)
    with pytest.raises(AssertionError, match=re.escape(where)):
        check_report(report)
