"""The reference trainer learns, and its history record is complete and consistent."""
import numpy as np
import pytest

from shared.config import Config
from shared.devices import configure_devices
from shared.errors import UsageError
from shared.reference import fit

# Measured: 3 epochs of Adam on the 4,000 embedded training images give test accuracy
# 0.927 (train loss 0.700 -> 0.256 -> 0.150); 0.90 leaves room for other CPUs' rounding.
MIN_TEST_ACCURACY_AFTER_3_EPOCHS = 0.90


@pytest.fixture(scope="module")
def history(devices, embedded):
    return fit(Config(epochs=3, quiet=True), embedded, devices)


def test_reference_learns_on_embedded_data(history):
    losses = [record.train_loss for record in history.epochs]
    assert losses[0] > losses[1] > losses[2]
    assert history.epochs[-1].test_accuracy >= MIN_TEST_ACCURACY_AFTER_3_EPOCHS
    assert history.step_losses[0] == pytest.approx(np.log(10), abs=0.1)  # untrained: ~uniform


def test_history_record_is_complete(history):
    steps_per_epoch = -(-4000 // 128)  # 31 full batches and one of 32
    assert len(history.step_losses) == 3 * steps_per_epoch
    assert [r.epoch for r in history.epochs] == [1, 2, 3]
    # The epoch's train loss is the example-weighted mean of its step losses.
    first_epoch = np.array(history.step_losses[:steps_per_epoch])
    counts = np.array([128] * 31 + [32])
    assert history.epochs[0].train_loss == pytest.approx((first_epoch * counts).sum() / 4000, rel=1e-9)
    assert [g.shape for g in history.first_step_gradients] == [w.shape for w in history.final_weights]
    assert history.trace_seconds > 0 and all(r.train_seconds > 0 for r in history.epochs)


def test_reference_is_deterministic(devices, embedded):
    config = Config(epochs=1, quiet=True, train_examples=300)
    small = embedded.__class__(embedded.x_train[:300], embedded.y_train[:300], embedded.x_test[:100],
                               embedded.y_test[:100], "embedded", "test slice")
    first, second = fit(config, small, devices), fit(config, small, devices[1:])
    assert first.step_losses == second.step_losses
    for a, b in zip(first.final_weights, second.final_weights):
        np.testing.assert_array_equal(a, b)


def test_device_requests_after_initialisation(devices):
    assert configure_devices(4) == ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]
    with pytest.raises(UsageError, match=r"--devices 9: TensorFlow is already initialised with 8 logical CPUs"):
        configure_devices(9)
    with pytest.raises(UsageError, match=r"--devices 0 is not possible"):
        configure_devices(0)
