"""--fit's option checks: Keras's model.fit trains a Keras model on one device (the reference) and under
MirroredStrategy (mirrored), and none of the project's own training options applies to it. They name trainers, so
they run here, where a Config enters a run (compare.py's flags, check_model's keywords, shared/run/comparison.py),
not in shared/config.py, which holds the options and no trainer's rules. Whether the model itself can be fitted:
check_fit_model (shared/training/keras_fit.py), once it is loaded."""

from dtensor_vs_mirrored.shared.config import BUILT_IN_MODELS, Config, flag
from dtensor_vs_mirrored.shared.errors import UsageError


def check_fit_options(config: Config) -> None:
    """--fit trains a Keras model with model.fit on one device and under MirroredStrategy, nothing else: UsageError,
    one line, for an option that asks for more."""
    if not config.fit:
        return
    if config.model in BUILT_IN_MODELS:
        raise UsageError(
            f"--fit trains a Keras model with its own model.fit; give --model FILE.py:FUNCTION returning one "
            f"(not {config.model})"
        )
    if "dtensor" in (config.trainers or ()):  # None: --fit's own default, which has no DTensor
        raise UsageError(
            "--fit trains Keras's model.fit, which has no DTensor path (keras-team/keras#18473); drop dtensor "
            "from --trainers"
        )
    if config.clients > 1:
        raise UsageError(
            f"--fit with --clients {config.clients}: Keras 3's model.fit fails under MultiWorkerMirroredStrategy "
            f"(keras-team/keras#20585; measured with Keras 3.15.1); use --clients 1"
        )
    if config.clip_global_norm is not None:
        raise UsageError(
            "--clip-global-norm clips the project's own trainers; under --fit the model's optimizer clips as you "
            "compiled it (global_clipnorm=...): drop --clip-global-norm"
        )
    refused = [
        flag(field)
        for field, on in (
            ("adam", config.adam != "fixed"),
            ("mirrored_update", config.mirrored_update != "auto"),
            ("sweep_devices", config.sweep_devices),
            ("profile", config.profile),
            ("checkpoint_dir", config.checkpoint_dir),
            ("restore", config.restore),
            ("export", config.export),
        )
        if on
    ]
    if refused:
        raise UsageError(f"{refused[0]} does not apply to --fit (Keras's model.fit trains there); drop it")
