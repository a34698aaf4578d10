"""A deterministic set of 32x32 colour images in an .npz, for examples/cnn_images.py and examples/keras_cnn.py.

    python examples/write_images.py images.npz
    python compare.py --model examples/cnn_images.py:cnn --data images.npz

NumPy only: it starts no TensorFlow (whose start-up lines would fill the terminal). The .npz holds x_train
[N, 32, 32, 3] float32, y_train [N] int64 of 10 classes, x_test and y_test, as `--data FILE.npz` reads them.
"""

import io
import sys

import numpy as np

from dtensor_vs_mirrored.shared.files import write_atomically

SIDE, COLOURS, CLASSES = 32, 3, 10


def write_images(path: str, train: int = 512, test: int = 128, seed: int = 7) -> None:
    """A learnable set: each class a random colour pattern, each image it plus noise."""
    rng = np.random.default_rng(seed)
    patterns = rng.uniform(0, 1, (CLASSES, SIDE, SIDE, COLOURS)).astype(np.float32)

    def split(count):
        labels = rng.integers(0, CLASSES, count)
        noise = rng.normal(0, 0.5, (count, SIDE, SIDE, COLOURS)).astype(np.float32)
        return (patterns[labels] + noise).astype(np.float32), labels.astype(np.int64)

    x_train, y_train = split(train)
    x_test, y_test = split(test)
    arrays = io.BytesIO()
    np.savez(arrays, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    write_atomically(path, arrays.getvalue())  # never half a file
    print(f"wrote {path}: {train} training and {test} test images [{SIDE}, {SIDE}, {COLOURS}] of {CLASSES} classes")


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "images.npz"
    try:
        write_images(target)
    except OSError as error:  # one line and exit 2, as compare.py's bad input: a path it cannot write
        print(
            f"write_images.py: cannot write {target}: {error.strerror or error}; choose a writable path",
            file=sys.stderr,
        )
        sys.exit(2)
