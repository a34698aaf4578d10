"""A Keras model's LayoutMap, audited before anything trains (shared/model/keras_layouts.py, shared/report/layouts.py):
each key's variables and layouts, a key that matches nothing and a large variable left whole on the model axis as
warning lines (not refusals), the weight bytes per device (equal to what DTensor's live variables hold), and where
Keras's other matching rule (re.search before 3.14, re.fullmatch from it) would lay out otherwise."""

import json

import jsonschema
import pytest

keras = pytest.importorskip(
    "keras",
    minversion="3",
    reason="Keras models need Keras 3 (TensorFlow 2.16 or later); this TensorFlow brings Keras 2",
)

from dtensor_vs_mirrored.shared.config import Config  # noqa: E402 - after the skip: these need Keras 3
from dtensor_vs_mirrored.shared.errors import UsageError  # noqa: E402
from dtensor_vs_mirrored.shared.model.keras_layouts import (  # noqa: E402
    FULLMATCH,
    SEARCH,
    RuleDifference,
    installed_rule,
    matching_keys,
)
from dtensor_vs_mirrored.shared.model.registry import load  # noqa: E402
from dtensor_vs_mirrored.shared.report.layouts import describe_layouts, difference_text, layouts_dict  # noqa: E402
from dtensor_vs_mirrored.shared.report.schema import SCHEMA_PATH  # noqa: E402
from tests.cli import run_here  # noqa: E402

AUDITED = "tests/models/keras_layouts.py:audited"
RUN = ("--data", "embedded", "--devices", "4", "--mesh", "batch=2,model=2")
with open(SCHEMA_PATH) as _file:
    LAYOUTS_SCHEMA = json.load(_file)["properties"]["model"]["properties"]["layouts"]


def test_a_key_written_for_re_search_matches_under_one_rule_only():
    """keras#22164: Keras 3.14 matches with re.fullmatch, so 'dense.*kernel' no longer reaches block_dense/kernel."""
    keys = ["dense.*kernel", "hidden/kernel", "hid.*"]
    assert matching_keys(keys, "block_dense/kernel", SEARCH) == ["dense.*kernel"]
    assert matching_keys(keys, "block_dense/kernel", FULLMATCH) == []
    assert matching_keys(keys, "hidden/kernel", SEARCH) == matching_keys(keys, "hidden/kernel", FULLMATCH)
    assert matching_keys(keys, "hidden/kernel", FULLMATCH) == ["hidden/kernel"]  # an exact key wins, as in Keras
    assert matching_keys(keys, "hidden/bias", FULLMATCH) == ["hid.*"]
    assert matching_keys([".*kernel", "dense"], "dense/kernel", SEARCH) == [".*kernel", "dense"]  # Keras raises
    for rule in (SEARCH, FULLMATCH):  # the docs' key for both releases
        assert matching_keys([".*dense.*kernel"], "block_dense/kernel", rule) == [".*dense.*kernel"]


def test_a_path_the_other_rule_matches_twice_is_said_to_be_an_error_there():
    difference = RuleDifference("dense/kernel", None, (".*kernel", "dense"))
    assert difference_text(difference) == "dense/kernel by 2 keys, an error there (here no key)"


class SearchingMap:
    """Keras 3.13's LayoutMap.__getitem__ matching, as its source reads (re.search)."""

    def __getitem__(self, key):
        import re

        return [pattern for pattern in () if re.search(pattern, key)]


def test_the_rule_is_read_from_the_installed_kerass_own_lookup():
    assert installed_rule(keras.distribution.LayoutMap, keras.__version__) == FULLMATCH  # Keras 3.15.1
    assert installed_rule(SearchingMap, "3.15.1") == SEARCH  # the source, not the version, decides
    assert installed_rule(dict, "3.13.2") == SEARCH  # no source to read: the version's
    assert installed_rule(dict, "3.14.0") == FULLMATCH


def test_a_layout_map_built_without_a_device_mesh_lays_out_the_variables():
    """keras.distribution.LayoutMap(None) sets no distribution: the map is only read, on the tool's own mesh."""
    definition = load(AUDITED)
    assert keras.distribution.distribution() is None
    layouts = {variable.name: variable.layout for variable in definition.variables}
    assert layouts["hidden/kernel"] == ("unsharded", "model") and layouts["hidden/bias"] == ("model",)
    assert layouts["block_dense/kernel"] == () and layouts["out/kernel"] == ()
    audit = definition.layout_audit
    assert (audit.rule, audit.unmatched) == (FULLMATCH, ["dense.*kernel", "experts/.*"])
    assert audit.key_for("hidden/bias") == "hidden/bias" and audit.key_for("block_dense/kernel") is None


def test_the_header_warns_of_an_unmatched_key_and_a_large_replicated_variable_and_notes_the_other_rule():
    config = Config(model=AUDITED, devices=4, mesh="batch=2,model=2")
    assert describe_layouts(config) == [
        "layouts: LayoutMap of 4 keys, matched by re.fullmatch as Keras 3.15.1 does: 'hidden/kernel' (None, 'model') "
        "1 variable, 'hidden/bias' ('model',) 1 variable; weights 0.11 MB per device of 0.20 MB on mesh "
        "batch=2,model=2",
        "warning: LayoutMap keys 'dense.*kernel', 'experts/.*' matched no variable, so their layouts apply to nothing "
        "(fine for a layer this model lacks; else compare them with the variables' paths: docs/keras.md)",
        "warning: whole on every device of the model axis of 2 (over 1% of the parameters each): block_dense/kernel "
        "(2,048, 3.9%); give each a LayoutMap key that splits it",
        "note: re.search (Keras before 3.14) would lay out otherwise: block_dense/kernel by 'dense.*kernel' "
        "(here no key)",
    ]
    laid = layouts_dict(config)
    jsonschema.validate(laid, LAYOUTS_SCHEMA)
    assert [(k["key"], k["axes"], k["variables"]) for k in laid["keys"]] == [
        ("hidden/kernel", [None, "model"], [{"path": "hidden/kernel", "layout": ["unsharded", "model"]}]),
        ("hidden/bias", ["model"], [{"path": "hidden/bias", "layout": ["model"]}]),
        ("dense.*kernel", ["model", None], []),
        ("experts/.*", [None, "model"], []),
    ]
    assert laid["unmatched_keys"] == ["dense.*kernel", "experts/.*"]
    assert laid["replicated"] == [{"path": "block_dense/kernel", "parameters": 2048}]
    assert laid["other_rule_differences"] == [
        {"path": "block_dense/kernel", "key": None, "other_keys": ["dense.*kernel"]}
    ]
    # 52,650 float32 parameters; hidden's 50,240 split in two: (25,088 + 32 + 2,048 + 32 + 320 + 10) x 4 bytes
    assert (laid["weight_bytes"], laid["weight_bytes_per_device"]) == (210_600, 110_120)


def test_without_a_model_axis_nothing_is_named_replicated_and_without_dtensor_no_bytes_per_device():
    on_batch = layouts_dict(Config(model=AUDITED, devices=4))
    assert (on_batch["mesh"], on_batch["replicated"], on_batch["weight_bytes_per_device"]) == ("batch=4", [], 210_600)
    assert on_batch["keys"][0]["variables"] == [{"path": "hidden/kernel", "layout": ["unsharded", "unsharded"]}]
    without = layouts_dict(Config(model=AUDITED, devices=4, trainers=("mirrored",)))
    assert (without["mesh"], without["weight_bytes_per_device"]) == (None, None)
    assert layouts_dict(Config(model="mlp")) is None


@pytest.mark.extended  # sharded bytes against live variables: tests/test_sharding.py (batch=8)
def test_the_reports_bytes_per_device_are_what_dtensors_variables_hold(tmp_path):
    """The audit's figure, known before training, against the live count of each device's DVariable components."""
    report_path = tmp_path / "report.json"
    result = run_here(
        "--model", AUDITED, *RUN, "--trainers", "dtensor", "--train-examples", "64", "--test-examples", "64",
        "--batch-size", "32", "--epochs", "1", "--json", report_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warning: LayoutMap keys 'dense.*kernel', 'experts/.*' matched no variable" in result.stdout
    report = json.loads(report_path.read_text())
    held = {record["weight_bytes"] for record in report["trainers"]["dtensor"]["memory_per_device"]}
    assert held == {report["model"]["layouts"]["weight_bytes_per_device"]} == {110_120}


def test_a_key_that_is_no_regular_expression_is_one_line_naming_it():
    """Keras's own lookup raised re.error from inside it, a traceback (exit 3) before."""
    with pytest.raises(UsageError) as refused:
        load("tests/models/keras_layouts.py:bad_regex")
    assert str(refused.value) == (
        "--model tests/models/keras_layouts.py:bad_regex: LayoutMap key 'out/kernel[0' is not a regular expression "
        "(unterminated character set at position 10); Keras matches every key as one: escape its special characters "
        "(re.escape) or fix it"
    )
