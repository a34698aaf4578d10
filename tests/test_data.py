"""Data sources, preprocessing, bad input, and the batch sequence every trainer sees."""

import gzip
import os
import sys

import numpy as np
import pytest

from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.training.batches import batch_slices, epoch_batches
from dtensor_vs_mirrored.shared.training.data import (
    IDX_FILES,
    IDX_IMAGES_MAGIC,
    IDX_LABELS_MAGIC,
    embedded_split,
    host_answers,
    load_data,
)


def write_idx(path, array, magic, compress=False):
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    payload = header + np.ascontiguousarray(array, np.uint8).tobytes()
    with gzip.open(path + ".gz", "wb") if compress else open(path, "wb") as f:
        f.write(payload)


@pytest.fixture
def idx_dir(tmp_path):
    """An MNIST IDX directory written from the embedded arrays (train plain, test gzipped)."""
    x_train, y_train, x_test, y_test = embedded_split()
    write_idx(str(tmp_path / IDX_FILES["train_images"]), x_train, IDX_IMAGES_MAGIC)
    write_idx(str(tmp_path / IDX_FILES["train_labels"]), y_train, IDX_LABELS_MAGIC)
    write_idx(str(tmp_path / IDX_FILES["test_images"]), x_test, IDX_IMAGES_MAGIC, compress=True)
    write_idx(str(tmp_path / IDX_FILES["test_labels"]), y_test, IDX_LABELS_MAGIC, compress=True)
    return tmp_path


def test_embedded_is_real_stratified_mnist(embedded):
    assert embedded.x_train.shape == (4000, 784) and embedded.x_test.shape == (1000, 784)
    assert embedded.x_train.dtype == np.float32 and embedded.y_train.dtype == np.int64
    assert 0.0 == embedded.x_train.min() and embedded.x_train.max() == 1.0
    assert np.bincount(embedded.y_train).tolist() == [400] * 10
    assert np.bincount(embedded.y_test).tolist() == [100] * 10
    # MNIST digits: about 19% of pixels are ink, the mean intensity is about 0.13.
    assert 0.10 < embedded.x_train.mean() < 0.16
    # Train and test are disjoint images.
    train_rows = {row.tobytes() for row in embedded.x_train}
    assert not any(row.tobytes() in train_rows for row in embedded.x_test)
    # Every global batch of 128 mixes all ten digits (the file itself is sorted by label).
    for _x_batch, y_batch in epoch_batches(embedded.x_train, embedded.y_train, 128):
        assert len(set(y_batch.tolist())) == 10


def test_embedded_split_is_deterministic():
    first, second = embedded_split(), embedded_split()
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def test_example_counts_and_limits():
    data = load_data("embedded", train_examples=300, test_examples=50)
    assert len(data.y_train) == 300 and len(data.y_test) == 50
    with pytest.raises(UsageError, match=r"--train-examples 4001 is more than the 4000 train examples"):
        load_data("embedded", train_examples=4001)
    with pytest.raises(UsageError, match=r"--test-examples 1001 is more than the 1000"):
        load_data("embedded", test_examples=1001)


def test_idx_directory_matches_embedded(idx_dir, embedded):
    data = load_data(str(idx_dir))
    assert data.source == str(idx_dir)
    # Defaults are the tutorial's 5000, capped at what the files hold (4000 and 1000 here).
    np.testing.assert_array_equal(data.x_train, embedded.x_train)
    np.testing.assert_array_equal(data.y_test, embedded.y_test)
    assert len(load_data(str(idx_dir), 100, 10).y_train) == 100


@pytest.mark.parametrize(
    "damage, message",
    [
        ("missing_dir", r"no such directory"),
        ("missing_file", r"t10k-labels-idx1-ubyte\[\.gz\] not found"),
        ("bad_magic", r"train-images-idx3-ubyte: IDX magic number 2049 is not 2051"),
        ("truncated", r"train-labels-idx1-ubyte: 3999 bytes but its header \[4000\] needs 4008"),
        ("count_mismatch", r"4000 train images but 3000 train labels"),
        ("corrupt_gzip", r"t10k-images-idx3-ubyte.gz: cannot read"),
    ],
)
def test_bad_idx_directory(idx_dir, damage, message):
    directory = idx_dir
    if damage == "missing_dir":
        directory = idx_dir / "nowhere"
    elif damage == "missing_file":
        os.remove(idx_dir / (IDX_FILES["test_labels"] + ".gz"))
    elif damage == "bad_magic":
        labels = np.zeros(4000, np.uint8)
        write_idx(str(idx_dir / IDX_FILES["train_images"]), labels, IDX_LABELS_MAGIC)
    elif damage == "truncated":
        path = idx_dir / IDX_FILES["train_labels"]
        path.write_bytes(path.read_bytes()[:-9])
    elif damage == "count_mismatch":
        write_idx(str(idx_dir / IDX_FILES["train_labels"]), np.zeros(3000, np.uint8), IDX_LABELS_MAGIC)
    elif damage == "corrupt_gzip":
        path = idx_dir / (IDX_FILES["test_images"] + ".gz")
        path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(UsageError, match=message) as error:
        load_data(str(directory))
    assert "\n" not in str(error.value)


def test_tfds_without_network_fails_fast_and_auto_falls_back(monkeypatch, tmp_path):
    """No prepared copy and no answer from the download host: one line, in seconds, not ~205 s."""
    import time

    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    if host_answers("storage.googleapis.com", seconds=3):
        pytest.skip("the MNIST download host answers here; the offline path cannot be exercised")
    started = time.perf_counter()
    with pytest.raises(UsageError, match=r"--data tfds: MNIST is not prepared in .* did not answer"):
        load_data("tfds")
    data = load_data("auto", 100, 10)
    assert data.source == "embedded" and data.reason.startswith("auto: MNIST is not prepared")
    assert data.fallback == data.reason[len("auto: ") :]  # the JSON's environment.data_fallback
    assert time.perf_counter() - started < 20


def test_tensorflow_datasets_imports_here():
    """tensorflow-datasets swallows its own import error and leaves a module without `builder`: it did
    with tensorflow-metadata 1.21.0 on protobuf < 6.31 (TensorFlow 2.12-2.19; pyproject excludes it)."""
    from importlib import metadata

    import tensorflow_datasets as tfds

    assert hasattr(tfds, "builder"), (
        f"tensorflow-datasets {metadata.version('tensorflow-datasets')} did not import "
        f"(protobuf {metadata.version('protobuf')}, tensorflow-metadata "
        f"{metadata.version('tensorflow-metadata')}): see the error it logged"
    )


def test_a_broken_tensorflow_datasets_is_one_line_for_tfds_and_a_fallback_for_auto(monkeypatch):
    """The state a failed tfds import leaves (a module without `builder`, as on TensorFlow 2.16 with
    tensorflow-metadata 1.21.0): --data tfds says so in one line, auto uses the embedded images."""
    import types

    monkeypatch.setitem(sys.modules, "tensorflow_datasets", types.ModuleType("tensorflow_datasets"))
    with pytest.raises(
        UsageError,
        match=r"^--data tfds: tensorflow_datasets does not work here \(AttributeError: "
        r".*'builder'\); use --data embedded",
    ) as error:
        load_data("tfds")
    assert "\n" not in str(error.value)
    data = load_data("auto", 100, 10)
    assert data.source == "embedded" and data.reason.startswith("auto: tensorflow_datasets does not work here")
    assert data.fallback.startswith("tensorflow_datasets does not work here")
    assert load_data("embedded", 100, 10).fallback == ""  # what was asked for: no fallback


def test_batch_sequence_keeps_the_partial_batch():
    assert [(s.start, s.stop) for s in batch_slices(5000, 128)][-2:] == [(4864, 4992), (4992, 5000)]
    assert len(batch_slices(5000, 128)) == 40


def test_batch_sequence_is_identical_across_calls_and_shuffles_by_seed(embedded):
    x, y = embedded.x_train[:300], embedded.y_train[:300]
    plain = list(epoch_batches(x, y, 64))
    assert [len(b[1]) for b in plain] == [64, 64, 64, 64, 44]
    np.testing.assert_array_equal(np.concatenate([b[1] for b in plain]), y)
    again = list(epoch_batches(x, y, 64, epoch=2))
    for (xa, _ya), (xb, _yb) in zip(plain, again):
        np.testing.assert_array_equal(xa, xb)
    shuffled = [
        np.concatenate([b[1] for b in epoch_batches(x, y, 64, epoch=e, shuffle=True, seed=s)])
        for e, s in ((0, 1), (0, 1), (1, 1), (0, 2))
    ]
    np.testing.assert_array_equal(shuffled[0], shuffled[1])
    assert not np.array_equal(shuffled[0], shuffled[2]) and not np.array_equal(shuffled[0], shuffled[3])
    assert sorted(shuffled[2].tolist()) == sorted(y.tolist())
