"""The training run every trainer shares: restore, first-step gradients, epochs, evaluation, checkpoints.

Written once, as Orbit's StandardTrainer and torchtitan's Trainer.train() are: `fit` calls the
parts a trainer supplies (what distributing changes: where the variables live, the train step,
the evaluation, reading the weights back): shared/training/protocol.py's `Trainer`.
"""

import itertools
from typing import Callable

from shared.config import Config
from shared.console import status
from shared.measure import profile
from shared.measure.checksums import read_state_checksums, state_names, state_sizes
from shared.measure.history import EpochMeter, History, format_epoch_line
from shared.training.batches import batch_slices, epoch_batches
from shared.training.checkpoint import TrainingState
from shared.training.data import Dataset
from shared.training.export import export_trainer
from shared.training.protocol import Trainer


def replayed_batch(config: Config, data: Dataset, step: int):
    """The global batch of training step `step` (0-based, counted over epochs)."""
    epoch, index = divmod(step, len(batch_slices(len(data.y_train), config.batch_size)))
    batches = epoch_batches(data.x_train, data.y_train, config.batch_size, epoch, config.shuffle, config.seed)
    return next(itertools.islice(batches, index, None))


def fit(trainer: Trainer, config: Config, data: Dataset, log: Callable = print) -> History:
    """Train `trainer` for config.epochs (from --restore's epoch) and return its history record."""
    history = History(
        trainer=trainer.name, placement=trainer.placement, dtype=config.dtype, details=dict(trainer.details)
    )
    definition = trainer.model.definition
    history.weight_names = definition.labels
    record_state = config.dtype == "float64"  # per-step state checksums: what parity names when it fails
    if record_state:
        history.state_names = state_names(definition, trainer.optimizer)
        history.state_sizes = state_sizes(definition, trainer.optimizer)

    def doing(what: str) -> None:  # what a trainer process's parent names if this process dies
        status(f"{trainer.name} on {trainer.placement}: {what}")

    state = TrainingState(trainer.name, config, *trainer.checkpointed, len(data.y_train), log)
    doing("restoring" if config.restore else "starting")
    start_epoch = state.restore()  # --restore: epochs already trained; 0 without
    trainer.begin(start_epoch)
    if config.replay_step is not None:  # shared/run/replay.py: this step's taps from this state, nothing trained
        doing(f"replaying step {config.replay_step}")
        history.taps = trainer.taps(*replayed_batch(config, data, config.replay_step))
        history.taps.step = config.replay_step
        return history
    first_x, first_y = next(
        epoch_batches(data.x_train, data.y_train, config.batch_size, start_epoch, config.shuffle, config.seed)
    )
    doing("tracing and running the first-step gradients")
    history.first_step_gradients = trainer.gradients(first_x, first_y)

    steps = len(batch_slices(len(data.y_train), config.batch_size))
    for epoch in range(start_epoch, config.epochs):
        meter = EpochMeter(f"{trainer.name} epoch {epoch + 1}/{config.epochs}", steps)
        traces_before = trainer.trace_count()
        doing(f"tracing the train step, epoch {epoch + 1}" if epoch == start_epoch else f"training epoch {epoch + 1}")
        trainer.train_epoch(epoch, meter, first=epoch == start_epoch, record_state=record_state)
        finished = meter.finish()  # before evaluating: the epoch's time is training only
        traces = trainer.trace_count() - traces_before
        if epoch == start_epoch:
            history.trace_seconds = meter.call_seconds[0]  # the first call: one step and its tracing
        doing(f"evaluating after epoch {epoch + 1}")
        test_loss, test_accuracy = trainer.evaluate(data.x_test, data.y_test)
        record = history.add_epoch(epoch + 1, meter, finished, test_loss, test_accuracy, traces)
        if not config.quiet:
            log(format_epoch_line(trainer.name, record, config.epochs))
        if config.checkpoint_dir:
            trainer.before_save()
        state.save_epoch(epoch + 1)  # --checkpoint-dir
    doing("reading the final weights")
    if record_state:
        history.add_final_state(read_state_checksums(trainer.state()))
    history.final_weights = trainer.final_weights()
    history.memory_per_device = trainer.memory_per_device()
    trainer.finish(history)
    export_trainer(
        config,
        trainer.name,
        definition,
        history.final_weights,
        trainer.predict_logits,  # --export
        data.x_test,
        history.details,
    )
    history.collectives = trainer.collectives
    doing("profiling a step" if config.profile else "counting the bytes a step sends")
    if config.profile:  # last: it steps the weights on, after every figure of the run is recorded
        history.step_profile, history.traffic, history.traffic_missing = profile.measure(trainer.step_call())
    elif record_state:  # the call that ran also checksums the state; counting a plain one would trace it anew
        history.traffic_missing = (
            "not counted: a float64 run's steps checksum the state too (--profile counts a plain step)"
        )
    else:  # the bytes per step alone, counted in the functions that ran: no step is run for them
        history.traffic, history.traffic_missing = trainer.step_call().traffic()
    return history
