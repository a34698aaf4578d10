"""The run's model and optimizer as plain variables: what the reference builds, and MirroredStrategy under its
scope (MirroredVariables) or on its first device."""

import tensorflow as tf

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.model.definition import Model
from dtensor_vs_mirrored.shared.model.registry import definition_for
from dtensor_vs_mirrored.shared.training.loss_scale import mixed_compute
from dtensor_vs_mirrored.shared.training.optim import make_optimizer


def build_model_and_optimizer(config: Config, make_variable=None):
    """The run's model from the shared initial values and its optimizer, all as plain tf.Variables:
    under `strategy.scope()` MirroredVariables, under `tf.device` placed there (`make_variable`: Model's)."""
    definition = definition_for(config)
    values = definition.initial_values(config.seed, config.weight_dtype)
    model = Model(definition, values, make_variable, seed=config.seed, compute_dtype=mixed_compute(config))
    optimizer = make_optimizer(
        config,
        model.trainable,
        zeros_like=lambda var: tf.Variable(tf.zeros_like(var)),
        make_step=lambda: tf.Variable(0, dtype=tf.int64),
        choice=definition.optimizer,  # a compiled Keras Adam or SGD
    )
    return model, optimizer
