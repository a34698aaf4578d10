"""An example test of a model that is not MNIST's: the CNN on 32x32x3 images of examples/cnn_images.py, trained
from an .npz that the test writes (deterministic, from a seed), with DTensor on a mesh with a model axis and
MirroredStrategy against one device.

    python -m pytest -m "" examples/test_cnn_images.py
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from dtensor_vs_mirrored.shared.api import check_model

HERE = os.path.dirname(os.path.abspath(__file__))


def write(tmp_path) -> str:
    """The images as a user writes them, by the script; it prints one line, and starts no TensorFlow (whose start-up
    lines it printed when the writer lived beside the model)."""
    images = str(tmp_path / "images.npz")
    written = subprocess.run([sys.executable, f"{HERE}/write_images.py", images], check=True, capture_output=True)
    assert written.stdout.decode() == f"wrote {images}: 512 training and 128 test images [32, 32, 3] of 10 classes\n"
    assert written.stderr == b""
    return images


def test_the_image_writer_prints_one_line_and_writes_the_arrays(tmp_path):
    arrays = np.load(write(tmp_path))
    assert {name: arrays[name].shape for name in arrays.files} == {
        "x_train": (512, 32, 32, 3),
        "y_train": (512,),
        "x_test": (128, 32, 32, 3),
        "y_test": (128,),
    }
    assert set(np.unique(arrays["y_train"])) == set(range(10))


def test_the_image_writer_given_a_path_it_cannot_write_says_so_in_one_line(tmp_path):
    target = str(tmp_path / "no" / "such" / "images.npz")
    written = subprocess.run([sys.executable, f"{HERE}/write_images.py", target], capture_output=True, text=True)
    assert written.returncode == 2 and written.stdout == ""
    assert (
        written.stderr == f"write_images.py: cannot write {target}: No such file or directory; choose a writable path\n"
    )
    assert not os.listdir(tmp_path)  # nothing half-written


# extended: a user's images from an .npz are checked and loaded in tests/test_user_models.py, a model of another
# input shape trains on every trainer in tests/test_gpt.py.
@pytest.mark.extended
def test_the_cnn_trains_the_same_from_its_own_images(tmp_path):
    images = write(tmp_path)
    result = check_model(
        f"{HERE}/cnn_images.py:cnn",
        meshes=("batch=2,model=2",),
        devices=4,
        data=images,
        epochs=2,
        batch_size=64,
        train_examples=128,
        test_examples=64,
    )
    assert result.ok, result.summary()
    assert set(result.verdicts) == {"dtensor batch=2,model=2", "mirrored"}
    assert all(verdict.verdict in ("ok", "float noise") for verdict in result.verdicts.values())
    reference = result.run.results["reference"].history
    assert reference.step_losses[-1] < reference.step_losses[0]  # it learns the classes' colour patterns
