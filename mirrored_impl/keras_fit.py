"""model.fit under MirroredStrategy (--fit): Keras's own loop over the strategy this package makes (its cross-device
ops; MultiWorkerMirroredStrategy with --clients), judged against model.fit on one device
(shared/training/keras_fit.py, which holds everything else).

    python compare.py --model examples/keras_fit.py:global_clipnorm --fit --data embedded --devices 4 --dtype float64
"""

from typing import Sequence

from dtensor_vs_mirrored.mirrored_impl.trainer import make_strategy
from dtensor_vs_mirrored.shared.training.keras_fit import KerasFitTrainer


class MirroredFitTrainer(KerasFitTrainer):
    """model.fit with the model built and compiled under the strategy's scope, one replica per device."""

    name = "mirrored"

    def place(self, devices: Sequence[str]):
        strategy, collectives, _ = make_strategy(self.config, devices)
        replicas = strategy.num_replicas_in_sync
        workers = f" ({self.config.clients} workers)" if self.config.clients > 1 else ""
        return strategy, f"model.fit, {replicas} replicas on {devices[0].split(':')[0]}{workers}", collectives

    def per_device(self, variables):
        """Every replica's copy of each variable."""
        return [copy for variable in variables for copy in self.strategy.experimental_local_results(variable)]
