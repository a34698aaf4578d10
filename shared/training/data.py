"""A run's data: MNIST from three sources, preprocessed as in the tutorial; tiny Shakespeare for a model that
names it (shared/training/text.py); or your own arrays from an .npz file (shared/training/npz.py).

Sources (`--data`):
  tfds      tensorflow-datasets' MNIST, the tutorial's splits train[:N] and test[:M]
  embedded  5,000 real MNIST images shipped in this package (shared/training/embedded/mnist_5k.npz),
            split deterministically and stratified into 4,000 train and 1,000 test
  DIR       the four standard MNIST IDX files, plain or .gz
  auto      tfds if it is prepared locally or its download host answers within a few
            seconds, else embedded (offline, `tfds.load` would retry for ~205 s), saying why
            in the header and the JSON report's environment.data_fallback
  FILE.npz  your arrays x_train, y_train, x_test, y_test, checked against the model's spec (a model of several
            named inputs: x_train_<name>, x_test_<name> for each, shared/training/npz_inputs.py)

The batches every trainer trains on: shared/training/batches.py.
"""

import dataclasses
import gzip
import importlib.resources
import os
from typing import Optional, Tuple

import numpy as np

from dtensor_vs_mirrored.shared.errors import TFDS_BROKEN, UsageError
from dtensor_vs_mirrored.shared.model.definition import ModelDefinition
from dtensor_vs_mirrored.shared.model.mnist import IMAGE_PIXELS, NUM_CLASSES
from dtensor_vs_mirrored.shared.model.registry import definition_for
from dtensor_vs_mirrored.shared.training import npz, npz_inputs, text
from dtensor_vs_mirrored.shared.training.batches import batch_label_counts
from dtensor_vs_mirrored.shared.training.dataset import PROBE_SECONDS, Dataset, example_count, host_answers, take

TFDS_DEFAULT_EXAMPLES = 5000  # the tutorial's train[:5000] and test[:5000]
EMBEDDED_TEST_PER_CLASS = 100  # 500 images per digit: 400 train, 100 test
TFDS_HOST = "storage.googleapis.com"  # where tensorflow-datasets downloads MNIST from

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
IDX_IMAGES_MAGIC = 2051
IDX_LABELS_MAGIC = 2049


def preprocess(images: np.ndarray, labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The tutorial's preprocessing: flatten to 784, scale to [0, 1] float32, int64 labels."""
    images = np.asarray(images).reshape(-1, IMAGE_PIXELS).astype(np.float32) / np.float32(255.0)
    return images, np.asarray(labels).reshape(-1).astype(np.int64)


# --- embedded -------------------------------------------------------------------------


def embedded_split() -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The shipped 5,000 images, split stratified: per digit the 5th, 10th, ... image is test.

    The file is sorted by label, so both splits are put in a fixed interleaved order
    (a stride permutation, no RNG whose stream could change between NumPy versions)
    that mixes the digits in every batch.
    """
    with importlib.resources.files(__package__).joinpath("embedded/mnist_5k.npz").open("rb") as f:
        arrays = np.load(f)
        images, labels = arrays["x"], arrays["y"]
    position_in_class = np.zeros(len(labels), dtype=np.int64)
    for digit in range(NUM_CLASSES):
        members = np.flatnonzero(labels == digit)
        position_in_class[members] = np.arange(len(members))
    test_every = len(labels) // NUM_CLASSES // EMBEDDED_TEST_PER_CLASS  # 5: every 5th image of a digit
    is_test = position_in_class % test_every == test_every - 1
    train_idx, test_idx = np.flatnonzero(~is_test), np.flatnonzero(is_test)
    train_idx, test_idx = train_idx[_stride_order(len(train_idx))], test_idx[_stride_order(len(test_idx))]
    return images[train_idx], labels[train_idx], images[test_idx], labels[test_idx]


def _stride_order(n: int, stride: int = 1237) -> np.ndarray:
    """A fixed permutation of range(n): k -> k * stride mod n (1237 is prime, so coprime to n here)."""
    assert np.gcd(n, stride) == 1, (n, stride)
    return (np.arange(n, dtype=np.int64) * stride) % n


def load_embedded(train_examples, test_examples, reason) -> Dataset:
    x_train, y_train, x_test, y_test = embedded_split()
    x_train, y_train = take("train", x_train, y_train, train_examples, len(y_train), "the embedded set")
    x_test, y_test = take("test", x_test, y_test, test_examples, len(y_test), "the embedded set")
    return Dataset(*preprocess(x_train, y_train), *preprocess(x_test, y_test), "embedded", reason)


# --- IDX directory ----------------------------------------------------------------------


def _read_idx(directory: str, stem: str, magic: int) -> np.ndarray:
    for name in (stem, stem + ".gz"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            break
    else:
        raise UsageError(
            f"{os.path.join(directory, stem)}[.gz] not found; --data DIR needs the four "
            f"MNIST IDX files {', '.join(IDX_FILES.values())}"
        )
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise UsageError(f"{path}: cannot read ({e}); replace it with an intact copy") from None
    if len(raw) < 8 or int.from_bytes(raw[:4], "big") != magic:
        found = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
        raise UsageError(
            f"{path}: IDX magic number {found} is not {magic}; "
            f"is this the {'images' if magic == IDX_IMAGES_MAGIC else 'labels'} file?"
        )
    ndim = raw[3]
    header = 4 + 4 * ndim
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + int(np.prod(dims))
    if len(raw) != expected:
        raise UsageError(
            f"{path}: {len(raw)} bytes but its header {dims} needs {expected}; "
            f"the file is truncated or corrupt, replace it"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def load_idx_dir(directory, train_examples, test_examples) -> Dataset:
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise UsageError(
            f"--data {directory}: a file, but neither an .npz nor a directory; give an .npz of your arrays, a "
            f"directory with the MNIST IDX files, or --data embedded"
        )
    if not os.path.isdir(directory):
        raise UsageError(
            f"--data {directory}: no such directory; give a directory with the MNIST IDX files, or use --data embedded"
        )
    if not os.access(directory, os.R_OK | os.X_OK):
        raise UsageError(f"--data {directory}: directory is not readable; fix its permissions")
    splits = []
    for split in ("train", "test"):
        images = _read_idx(directory, IDX_FILES[f"{split}_images"], IDX_IMAGES_MAGIC)
        labels = _read_idx(directory, IDX_FILES[f"{split}_labels"], IDX_LABELS_MAGIC)
        if images.ndim != 3 or images.shape[1:] != (28, 28):
            raise UsageError(f"{directory}: {split} images have shape {images.shape}, not [N, 28, 28]")
        if len(images) != len(labels):
            raise UsageError(
                f"{directory}: {len(images)} {split} images but {len(labels)} {split} "
                f"labels; the two files must come from the same set"
            )
        if labels.size and labels.max() >= NUM_CLASSES:
            raise UsageError(f"{directory}: {split} label {labels.max()} is not a digit 0-9")
        requested = train_examples if split == "train" else test_examples
        splits += preprocess(*take(split, images, labels, requested, TFDS_DEFAULT_EXAMPLES, directory))
    return Dataset(*splits, directory, "IDX files")


# --- tensorflow-datasets ------------------------------------------------------------------


def tfds_availability() -> Tuple[bool, str]:
    """Whether `tfds.load("mnist")` can succeed without the ~205 s offline retry, and why."""
    try:
        import tensorflow_datasets as tfds

        builder = tfds.builder("mnist")
    except Exception as error:  # noqa: BLE001 - a broken install: its import logs the cause and leaves no `builder`
        return False, f"{TFDS_BROKEN} ({type(error).__name__}: {error})"
    if builder.is_prepared():
        return True, f"MNIST is prepared in {builder.data_dir}"
    if host_answers(TFDS_HOST):
        return True, f"MNIST is not prepared locally but {TFDS_HOST} answers; downloading"
    return False, (
        f"MNIST is not prepared in {builder.data_dir} and {TFDS_HOST} did not answer within {PROBE_SECONDS:.0f} s"
    )


def load_tfds(train_examples, test_examples, reason) -> Dataset:
    import tensorflow_datasets as tfds

    n_train = example_count("train", train_examples, TFDS_DEFAULT_EXAMPLES, 60000, "tfds MNIST")
    n_test = example_count("test", test_examples, TFDS_DEFAULT_EXAMPLES, 10000, "tfds MNIST")
    (x_train, y_train), (x_test, y_test) = tfds.as_numpy(
        tfds.load("mnist", split=[f"train[:{n_train}]", f"test[:{n_test}]"], batch_size=-1, as_supervised=True)
    )
    return Dataset(*preprocess(x_train, y_train), *preprocess(x_test, y_test), "tfds", reason)


def load_run_data(config) -> Dataset:
    """The run's data for its model, checked to hold one global batch, each with a label that counts."""
    data = load_data(config.data, config.train_examples, config.test_examples, definition_for(config), config.dtype)
    if len(data.y_train) < config.batch_size:
        raise UsageError(
            f"--data {config.data}: {len(data.y_train)} training examples are fewer than one global batch of "
            f"{config.batch_size}; use --batch-size {len(data.y_train)} or more data"
        )
    check_every_batch_counts(config, data)
    return data


def check_every_batch_counts(config, data: Dataset) -> None:
    """UsageError unless every global batch of every epoch has a label that counts: its mean loss divides by the
    count (shared/training/losses.py). Only your arrays can mask labels (negative ones)."""
    if (data.y_train >= 0).all():
        return
    for epoch in range(config.epochs if config.shuffle else min(config.epochs, 1)):  # unshuffled: alike each epoch
        counts = batch_label_counts(data.y_train, config.batch_size, epoch, config.shuffle, config.seed)
        if 0 in counts:
            raise UsageError(
                f"--data {config.data}: global batch {counts.index(0)} of epoch {epoch + 1} has no label that counts "
                f"(each is negative), so its mean loss would divide by zero; mix the masked examples with others, "
                f"or use another --batch-size"
            )


def load_data(
    source: str,
    train_examples: Optional[int] = None,
    test_examples: Optional[int] = None,
    definition: Optional[ModelDefinition] = None,
    dtype: str = "float32",
) -> Dataset:
    """Load and preprocess `source` (see the module docstring) for `definition` (None: MNIST as [N, 784]) in a
    run of `dtype` (a float64 .npz stays float64 in a float64 run)."""
    several = definition is not None and bool(definition.inputs)  # a model of several named inputs
    if source.endswith(".npz"):
        load_npz = npz_inputs.load if several else npz.load
        return load_npz(source, definition or ModelDefinition("", (), None, 0), train_examples, test_examples, dtype)
    if several:
        npz_inputs.refuse_other_data(source, definition)
    if definition is not None and definition.default_data == "tiny_shakespeare":
        return text.load(source, definition, train_examples, test_examples)
    data = load_mnist(source, train_examples, test_examples)
    return data if definition is None else mnist_for(data, definition)


def mnist_for(data: Dataset, definition: ModelDefinition) -> Dataset:
    """MNIST shaped as the model takes it ([N, 28, 28, 1] for a CNN), or one line saying why it cannot be."""
    shape = tuple(definition.input_shape)
    if definition.targets != "classes":
        raise UsageError(
            f"model {definition.name} is trained with the loss {definition.loss_name} on {definition.targets} "
            f"targets [N, {', '.join(map(str, definition.label_shape))}], not MNIST's class ids; give its data with "
            f"--data FILE.npz"
        )
    if int(np.prod(shape)) != IMAGE_PIXELS or definition.label_shape != () or definition.classes < NUM_CLASSES:
        raise UsageError(
            f"model {definition.name} takes inputs {list(shape)} {definition.input_dtype} with labels "
            f"{list(definition.label_shape)} of {definition.classes} classes, not MNIST's 28x28 images of 10 digits; "
            f"give its data with --data FILE.npz"
        )
    reshape = lambda x: x.reshape(len(x), *shape)  # noqa: E731
    return dataclasses.replace(data, x_train=reshape(data.x_train), x_test=reshape(data.x_test))


def load_mnist(source: str, train_examples: Optional[int], test_examples: Optional[int]) -> Dataset:
    if source == "embedded":
        return load_embedded(train_examples, test_examples, "--data embedded")
    if source in ("tfds", "auto"):
        available, why = tfds_availability()
        if available:
            return load_tfds(train_examples, test_examples, why)
        if source == "tfds":
            raise UsageError(f"--data tfds: {why}; use --data embedded, or a directory of MNIST IDX files")
        # Other data than on a machine where tfds works: the header and the JSON say so.
        return dataclasses.replace(load_embedded(train_examples, test_examples, f"auto: {why}"), fallback=why)
    return load_idx_dir(source, train_examples, test_examples)
