"""SavedModel export: any trainer's weights as a plain model that serves without mesh or strategy.

    python compare.py --data embedded --export exported
    python -m dtensor_vs_mirrored.shared.export exported/dtensor     # reload in a fresh process and check it

Each trainer hands over its final weights as arrays (a sharded DVariable all-gathered first), saved
as plain variables in the run's model: `serving_default` takes the model's input, `images` [None, 784]
float32 for the MLP (`tokens` [None, 64] int32 for the GPT: the input's name says which), and returns
`logits` and `probabilities`. Each export carries its self-check in assets.extra/probe.npz: test
inputs and the trainer's own logits for them, compared within LOGIT_TOLERANCE
(docs/checkpoints-and-export.md). Written beside its final name and renamed into place.
"""

import os
import sys
from typing import Callable, Dict, Sequence

import numpy as np
import tensorflow as tf

from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.files import partial_path, publish_directory
from dtensor_vs_mirrored.shared.model.definition import Model

PROBE_EXAMPLES = 100
PROBE_FILE = os.path.join("assets.extra", "probe.npz")
KERAS_FILE = "model.keras"  # a Keras model's own format, beside the SavedModel
# Logits of the same weights on a mesh or one device differ by summation order only:
# measured up to ~1e-6 for logits of magnitude ~10; 1e-4 leaves room and still catches any wrong weight.
LOGIT_TOLERANCE = 1e-4


def input_name(definition) -> str:
    """What the serving signature calls the input: images (float), tokens (integers)."""
    return "images" if definition.input_dtype.startswith("float") else "tokens"


class ServingModel(tf.Module):
    """The trained model with plain float32 variables and one serving function of the model's input spec."""

    def __init__(self, definition, weights: Sequence[np.ndarray]):
        super().__init__()
        self.model = Model(definition, [np.asarray(w, np.float32) for w in weights])
        spec = tf.TensorSpec([None, *definition.input_shape], definition.input_dtype, name=input_name(definition))
        self.serve = tf.function(self.logits_and_probabilities, input_signature=[spec])

    def logits_and_probabilities(self, inputs) -> Dict[str, tf.Tensor]:
        logits = self.model(inputs)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits)}


def export_model(
    directory: str, definition, weights: Sequence[np.ndarray], trainer_logits: Callable, probe_images: np.ndarray
) -> float:
    """Write a SavedModel of `weights` to `directory`; returns the largest |logit| difference
    between it and `trainer_logits(probe_images)`, the trainer's own forward pass."""
    probe_images = np.asarray(probe_images[:PROBE_EXAMPLES], definition.input_dtype)
    expected = np.asarray(trainer_logits(probe_images), np.float32)
    with tf.device("CPU:0"):  # not on a mesh or under a strategy; SavedModel does not record the device
        serving = ServingModel(definition, weights)
        served = serving.serve(tf.constant(probe_images))["logits"].numpy()
    os.makedirs(os.path.dirname(os.path.abspath(directory)), exist_ok=True)
    partial = partial_path(directory)
    tf.saved_model.save(serving, partial, signatures={"serving_default": serving.serve})
    save_native(definition, weights, partial)
    os.makedirs(os.path.join(partial, "assets.extra"))
    np.savez(os.path.join(partial, PROBE_FILE), inputs=probe_images, trainer_logits=expected)
    publish_directory(partial, directory)
    return float(np.max(np.abs(served - expected))) if len(expected) else 0.0


def save_native(definition, weights: Sequence[np.ndarray], directory: str) -> None:
    """The model in its own format beside the SavedModel, from the same float32 weights: a Keras model's
    DIR/<trainer>/model.keras, which keras.saving.load_model loads (shared/model/keras.py)."""
    if definition.save_as is not None:
        with tf.device("CPU:0"):
            definition.save_as([np.asarray(w, np.float32) for w in weights], os.path.join(directory, KERAS_FILE))


def check_keras_file(directory: str) -> float:
    """Load an export's model.keras with keras.saving.load_model and return its largest |logit| difference from
    the trainer's own on the probe inputs."""
    import keras

    probe = np.load(os.path.join(directory, PROBE_FILE))
    model = keras.saving.load_model(os.path.join(directory, KERAS_FILE))
    logits = np.asarray(model.predict(probe["inputs"], verbose=0))
    return float(np.max(np.abs(logits - probe["trainer_logits"])))


def export_trainer(
    config,
    trainer: str,
    definition,
    weights: Sequence[np.ndarray],
    trainer_logits: Callable,
    probe_images: np.ndarray,
    details: dict,
) -> None:
    """--export DIR: write DIR/<trainer> and record where and how close in `details`."""
    if not config.export:
        return
    directory = os.path.join(config.export, trainer)
    difference = export_model(directory, definition, weights, trainer_logits, probe_images)
    details["export"] = directory
    details["export_max_abs_logit_diff"] = f"{difference:.3g}"


def check_exportable(definition) -> None:
    """The serving signature takes one input (images or tokens): a model of several named inputs is refused, before
    anything trains."""
    if definition.inputs:
        names = ", ".join(named.name for named in definition.inputs)
        raise UsageError(
            f"--export: the model takes {len(definition.inputs)} inputs ({names}), and the export's serving "
            f"signature takes one; drop --export (your Keras model's own model.save writes all of them)"
        )


def check_targets(export_dir: str, trainers: Sequence[str]) -> None:
    """--export DIR replaces DIR/<trainer>: refuse, before anything trains, one that holds something other than
    an earlier export (its PROBE_FILE says it is one); an empty directory is taken."""
    for trainer in trainers:
        target = os.path.join(export_dir, trainer)
        if not os.path.lexists(target) or os.path.isfile(os.path.join(target, PROBE_FILE)):
            continue
        if os.path.isdir(target) and not os.path.islink(target) and not os.listdir(target):
            continue
        raise UsageError(
            f"--export {export_dir}: {target} exists and is not an export of compare.py (it has no {PROBE_FILE}), "
            f"and the export would replace it; move it, or choose another directory"
        )


def check_export(directory: str) -> float:
    """Load an export with tf.saved_model.load and return its largest |logit| difference from the
    trainer's own on the probe images; also checks that probabilities are the logits' softmax."""
    loaded = tf.saved_model.load(directory)
    probe = np.load(os.path.join(directory, PROBE_FILE))
    serve = loaded.signatures["serving_default"]
    (name,) = serve.structured_input_signature[1]  # images or tokens
    outputs = serve(**{name: tf.constant(probe["inputs"])})
    logits, probabilities = outputs["logits"].numpy(), outputs["probabilities"].numpy()
    np.testing.assert_allclose(probabilities, tf.nn.softmax(logits).numpy(), atol=1e-6)
    return float(np.max(np.abs(logits - probe["trainer_logits"])))


def main(argv: Sequence[str]) -> int:
    """`python -m dtensor_vs_mirrored.shared.export [--verbose] DIR...`: one line per export; exit 1 if any differs by
    more than LOGIT_TOLERANCE, 2 (one line, nothing checked) if a DIR is not an export of this project."""
    directories = [arg for arg in argv if arg != "--verbose"]  # --verbose: TensorFlow's lines, shown above
    missing = [d for d in directories if not os.path.isfile(os.path.join(d, PROBE_FILE))]
    if missing or not directories:
        if not directories:
            problem = "give the directories that compare.py --export DIR wrote, DIR/<trainer>"
        elif not os.path.exists(missing[0]):
            problem = f"{missing[0]}: no such directory; give one that compare.py --export DIR wrote, DIR/<trainer>"
        else:
            problem = f"{missing[0]} is not an export of compare.py --export (it has no {PROBE_FILE})"
        print(f"python -m dtensor_vs_mirrored.shared.export: error: {problem}", file=sys.stderr)
        return 2
    worst = 0.0
    for directory in directories:
        difference = check_export(directory)
        worst = max(worst, difference)
        print(
            f"{directory}: max |logit diff| {difference:.3g} against the trainer's own on its probe images, "
            f"tolerance {LOGIT_TOLERANCE:g} ({'ok' if difference <= LOGIT_TOLERANCE else 'FAILED'})"
        )
        if os.path.isfile(os.path.join(directory, KERAS_FILE)):
            difference = check_keras_file(directory)
            worst = max(worst, difference)
            print(
                f"{os.path.join(directory, KERAS_FILE)}: max |logit diff| {difference:.3g} (keras.saving.load_model), "
                f"tolerance {LOGIT_TOLERANCE:g} ({'ok' if difference <= LOGIT_TOLERANCE else 'FAILED'})"
            )
    return 0 if worst <= LOGIT_TOLERANCE else 1
