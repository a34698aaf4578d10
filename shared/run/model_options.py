"""The built-in models' options: --dropout's rate, and --dropout and --hidden only where a built-in model (the MLP's
layers) reads them. Checked where a Config enters a run (compare.py's flags, check_model's keywords), without
TensorFlow: the models' own module (shared/model/registry.py) imports it."""

from dtensor_vs_mirrored.shared.config import BUILT_IN_MODELS, Config
from dtensor_vs_mirrored.shared.errors import UsageError


def check_model_options(config: Config) -> None:
    if not 0 <= config.dropout < 1:
        raise UsageError(f"--dropout {config.dropout}: a rate is at least 0 and below 1, e.g. 0.1")
    if config.dropout and config.model not in BUILT_IN_MODELS:
        raise UsageError(
            f"--dropout sets the built-in models' dropout; your model ({config.model}) calls context.dropout in its "
            f"forward itself (docs/models.md): drop --dropout"
        )
    if config.hidden is not None and config.model != "mlp":
        raise UsageError(f"--hidden sets the MLP's layers; drop it, or use --model mlp (not {config.model})")
