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
