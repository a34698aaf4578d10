"""Test set-up: 8 logical CPUs, configured once for the whole pytest process.

TensorFlow fixes its devices on first use, so every test in this process shares
these 8 and builds meshes and strategies over the first N of them.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest

from shared.devices import configure_devices

TEST_DEVICES = configure_devices(8, "CPU")


@pytest.fixture(scope="session")
def devices():
    return TEST_DEVICES


@pytest.fixture(scope="session")
def embedded():
    from shared.data import load_data

    return load_data("embedded")


# Modules by their share of the suite's time (seconds of one worker, measured in one full run on 2 cores),
# heaviest first: pytest-xdist hands whole modules to its two workers in collection order, so a heavy module
# collected last would keep one worker busy while the other idles.
HEAVIEST_FIRST = [
    "test_baseline.py",  # 249
    "test_verdicts.py",  # 237
    "test_dtensor.py",  # 205
    "test_checkpoint.py",  # 164
    "test_mirrored.py",  # 114
    "test_multiclient.py",  # 103
    "test_vit.py",  # 75
    "test_reproducibility.py",  # 57
    "test_compare.py",  # 41
    "test_my_model.py",  # 40
    "test_profile.py",  # 36
]


def pytest_collection_modifyitems(items):
    def weight(item):
        name = item.path.name
        return HEAVIEST_FIRST.index(name) if name in HEAVIEST_FIRST else len(HEAVIEST_FIRST)

    items.sort(key=weight)  # stable: within a module, and among the rest, the collected order stays
