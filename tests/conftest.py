"""Test set-up: 8 logical CPUs, configured once for the whole pytest process.

TensorFlow fixes its devices on first use, so every test in this process shares
these 8 and builds meshes and strategies over the first N of them.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest

from dtensor_vs_mirrored.shared.devices import configure_devices

TEST_DEVICES = configure_devices(8, "CPU")


@pytest.fixture(scope="session")
def devices():
    return TEST_DEVICES


@pytest.fixture(scope="session")
def embedded():
    from dtensor_vs_mirrored.shared.training.data import load_data

    return load_data("embedded")


# Modules by their share of the suite's time (pytest --durations=0 on 2 cores, per cent of the whole), heaviest
# first: pytest-xdist hands whole modules to its two workers in collection order, and a heavy module collected last
# (test_vit.py, alphabetically) kept one worker busy ~30 s after the other had finished.
HEAVIEST_FIRST = [
    "test_mixed_precision.py",  # 8.5
    "test_gpt.py",  # 6.9
    "test_checkpoint.py",  # 6.6
    "test_keras_objective.py",  # 6.2
    "test_mirrored.py",  # 4.8
    "test_keras_shapes.py",  # 4.6
    "test_first_difference.py",  # 3.7
    "test_keras_inputs.py",  # 3.4
    "test_split_classes.py",  # 3.2
    "test_verdicts.py",  # 2.8
    "test_fit.py",  # 2.6
    "test_keras_cnn.py",  # 2.5
    "test_dtensor.py",  # 2.5
    "test_reference.py",  # 2.4
    "test_traffic.py",  # 2.3
    "test_randomness.py",  # 2.2
    "test_multiclient.py",  # 2.0
    "test_compare.py",  # 1.8
    "test_fit_mixed.py",  # 1.8
    "test_clipping.py",  # 1.7
    "test_packaging.py",  # 1.7
    "test_keras.py",  # 1.7
]


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(config, items):
    # What a session that collected the whole suite held before `-m` chose, on the config (this module is imported
    # twice, as conftest and tests.conftest): tests/test_docs.py checks the README's counts without a collection.
    if config.args == config.getini("testpaths") and not config.option.keyword:
        config.suite_counts = (len(items), sum(1 for item in items if item.get_closest_marker("extended")))

    def weight(item):
        name = item.path.name
        return HEAVIEST_FIRST.index(name) if name in HEAVIEST_FIRST else len(HEAVIEST_FIRST)

    items.sort(key=weight)  # stable: within a module, and among the rest, the collected order stays
