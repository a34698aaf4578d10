"""What makes Keras's model.fit under MirroredStrategy compute otherwise than on one device, known before it trains
(--fit; the header's cautions, each naming `mirrored`): the model's layers, its compile settings, and how the run's
batches split over the replicas. docs/keras.md, "model.fit under MirroredStrategy", says why for each.
"""

import math
from typing import List, Tuple

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.model import keras_compat
from dtensor_vs_mirrored.shared.model.definition import Caution
from dtensor_vs_mirrored.shared.model.keras import draws, unsynchronized_batch_norms
from dtensor_vs_mirrored.shared.model.registry import definition_for
from dtensor_vs_mirrored.shared.training.keras_fit import CLIPPING, compile_settings, keras_module


def rebatch_pieces(batch: int, replicas: int) -> List[int]:
    """How tf.data's rebatch cuts a global batch over the replicas under a strategy: ceil(batch / replicas) each,
    the last the rest (measured, TensorFlow 2.21: 44 over 8 is 6 x 7 and 2; 3 over 4 leaves one empty)."""
    size = math.ceil(batch / replicas)
    return [max(0, min(size, batch - size * index)) for index in range(replicas)]


def batch_sizes(train_examples: int, batch_size: int) -> List[int]:
    """The distinct global batch sizes of an epoch: the full one, and a partial last one if any."""
    sizes = [min(batch_size, train_examples)]
    if train_examples > batch_size and train_examples % batch_size:
        sizes.append(train_examples % batch_size)
    return sizes


def fit_cautions(config: Config, train_examples: int) -> Tuple[Caution, ...]:
    """What makes model.fit under MirroredStrategy compute otherwise than on one device, known before it trains:
    the model's layers, its compile settings and how the run's batches split over the replicas."""
    definition = definition_for(config)
    model, settings = definition.keras_model, compile_settings(definition.keras_model) or {}
    replicas = config.clients if config.clients > 1 else config.devices
    return (
        layer_cautions(model, keras_module())
        + clipping_cautions(settings)
        + loss_scale_cautions(config, replicas)
        + piece_cautions(config.batch_size, train_examples, replicas, settings)
    )


def loss_scale_cautions(config: Config, replicas: int) -> Tuple[Caution, ...]:
    """mixed_float16 under MirroredStrategy: Keras's LossScaleOptimizer decides a step on replica 0's gradients."""
    if config.dtype != "mixed_float16" or replicas < 2:
        return ()
    return (
        Caution(
            f"loss scaling on one replica's gradients: under MirroredStrategy Keras {keras_module().__version__}'s "
            f"LossScaleOptimizer takes its finite check from replica 0's local gradients, not the combined ones "
            f"(keras/src/optimizers/loss_scale_optimizer.py _tf_apply), so a step whose float16 gradient overflows "
            f"on another replica's piece alone is applied (its inf or NaN reaches the weights) where one device "
            f"skips it, and one that overflows on replica 0's alone is skipped by all; without --fit the project's "
            f"trainers decide on the combined gradient",
            ("mirrored",),
        ),
    )


def layer_cautions(model, keras) -> Tuple[Caution, ...]:
    """Keras's own BatchNormalization and random layers (a drop-in Dropout is Keras's Dropout in model.fit)."""
    layers = keras_compat.flat_layers(model)
    found = []
    unsynchronized = unsynchronized_batch_norms(layers, keras)
    if unsynchronized:
        found.append(
            Caution(
                f"{', '.join(unsynchronized)}: batch norm per replica: Keras BatchNormalization without "
                f"synchronized=True normalises each replica's piece of the batch under MirroredStrategy (one device "
                f"the whole batch); use BatchNormalization(synchronized=True)",
                ("mirrored",),
            )
        )
    random = [layer.name for layer in layers if draws(layer)]
    if random:
        found.append(
            Caution(
                f"{', '.join(random)}: random per replica: each replica draws its piece's numbers from the same seed "
                f"state under MirroredStrategy, so model.fit there draws other numbers than on one device",
                ("mirrored",),
                random=True,
            )
        )
    return tuple(found)


def clipping_cautions(settings: dict) -> Tuple[Caution, ...]:
    """The optimizer's clipnorm, global_clipnorm and clipvalue: Keras clips each replica's gradient."""
    optimizer = settings.get("optimizer")
    options = optimizer.get("config", {}) if isinstance(optimizer, dict) else {}
    clipping = [f"{name}={options[name]:g}" for name in CLIPPING if options.get(name) is not None]
    if not clipping:
        return ()
    return (
        Caution(
            f"the optimizer's {', '.join(clipping)}: clipping before the all-reduce: under MirroredStrategy Keras "
            f"clips each replica's part of the gradient (its optimizer's apply runs per replica; tensorflow#33929), "
            f"one device the whole gradient, so the update differs from the first step that clips; no compile "
            f"setting clips the combined gradient: drop it under a strategy, or clip after the all-reduce in a "
            f"train step of yours (as compare.py --clip-global-norm does for the project's trainers)",
            ("mirrored",),
        ),
    )


def piece_cautions(batch_size: int, train_examples: int, replicas: int, settings: dict) -> Tuple[Caution, ...]:
    """A global batch that does not divide over the replicas: Keras divides each replica's mean loss by the
    replica count, so unequal pieces weigh examples unequally; and the compiled metrics average per replica."""
    found = []
    uneven = [size for size in batch_sizes(train_examples, batch_size) if size % replicas]
    if uneven and replicas > 1:
        pieces = "; ".join(
            f"{'the last batch' if size != batch_size else 'every batch'} of {size} in pieces of "
            f"{', '.join(map(str, rebatch_pieces(size, replicas)))}"
            for size in uneven
        )
        found.append(
            Caution(
                f"unequal pieces: {pieces} over {replicas} replicas; Keras's loss is each replica's mean divided by "
                f"{replicas} (loss reduction per replica), so a smaller piece's examples weigh more than on one "
                f"device; use a batch size and example count whose batches divide over {replicas}",
                ("mirrored",),
            )
        )
    metrics = [m if isinstance(m, str) else m.get("class_name", "?") for m in settings.get("metrics") or []]
    if metrics and replicas > 1:
        found.append(
            Caution(
                f"metrics per replica: Keras reports the compiled metrics ({', '.join(map(str, metrics))}) as the mean "
                f"of the replicas' results under MirroredStrategy, one device's over the batch when the pieces are "
                f"equal; they are logs: the judged losses and weights do not depend on them",
                ("mirrored",),
                in_reason=False,
            )
        )
    return tuple(found)
