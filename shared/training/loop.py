"""The training run every trainer shares: restore, first-step gradients, epochs, evaluation, checkpoints.

Written once, as Orbit's StandardTrainer and torchtitan's Trainer.train() are: `fit` calls the parts a
trainer supplies (what distributing changes: where the variables live, the train step, the test batches,
reading the weights back): shared/training/protocol.py's `Trainer`; the step's arithmetic is step.py's.
"""

import itertools
from typing import Callable

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.console import status
from dtensor_vs_mirrored.shared.measure import profile
from dtensor_vs_mirrored.shared.measure.checksums import read_state_checksums, state_names, state_sizes
from dtensor_vs_mirrored.shared.measure.history import EpochMeter, History
from dtensor_vs_mirrored.shared.training import step
from dtensor_vs_mirrored.shared.training.batches import batch_slices, epoch_batches
from dtensor_vs_mirrored.shared.training.checkpoint import TrainingState
from dtensor_vs_mirrored.shared.training.data import Dataset
from dtensor_vs_mirrored.shared.training.export import export_trainer
from dtensor_vs_mirrored.shared.training.loss_scale import loss_scale_record, skipped_steps
from dtensor_vs_mirrored.shared.training.losses import host_label_count
from dtensor_vs_mirrored.shared.training.optim import clipping_record
from dtensor_vs_mirrored.shared.training.protocol import Progress, RunControl, Trainer


def global_batches(config: Config, data: Dataset, start: int = 0):
    """Every trainer's global batches, epoch after epoch, from step `start` (0-based, counted over epochs): its
    epoch's batches from that one on, no earlier epoch's made."""
    first_epoch, index = divmod(start, len(batch_slices(len(data.y_train), config.batch_size)))
    batches = itertools.chain.from_iterable(
        epoch_batches(data.x_train, data.y_train, config.batch_size, epoch, config.shuffle, config.seed)
        for epoch in itertools.count(first_epoch)
    )
    return itertools.islice(batches, index, None)


def fit(
    trainer: Trainer, config: Config, data: Dataset, progress: Progress, count_bytes: Callable, control: RunControl
) -> History:
    """Train `trainer` for config.epochs (from --restore's epoch) and return its history record; with
    control.replay_step, record that step's taps instead and train nothing (shared/run/replay.py)."""
    history = History(
        trainer=trainer.name, placement=trainer.placement, dtype=config.dtype, details=dict(trainer.details)
    )
    history.weight_names = trainer.model.definition.labels
    if config.dtype == "float64":  # per-step state checksums: what parity names when it fails
        history.state_names = state_names(trainer.model.definition, trainer.optimizer)
        history.state_sizes = state_sizes(trainer.model.definition, trainer.optimizer)
    state = TrainingState(trainer.name, config, *trainer.checkpointed, len(data.y_train), progress.line)
    doing(trainer, "restoring" if config.restore else "starting")
    start_epoch = state.restore(mid_epoch=control.replay_step is not None)  # epochs already trained; 0 without
    trainer.begin(start_epoch)
    if control.replay_step is not None:
        replay(trainer, config, data, state, control, history)
        return history
    if not trainer.steps_give_gradients or start_epoch >= config.epochs:  # else the first call's (train_and_evaluate)
        first_x, first_y = next(
            epoch_batches(data.x_train, data.y_train, config.batch_size, start_epoch, config.shuffle, config.seed)
        )
        doing(trainer, "tracing and running the first-step gradients")
        history.first_step_gradients = trainer.gradients(first_x, first_y)
    for epoch in range(start_epoch, config.epochs):
        train_and_evaluate(
            trainer, config, data, progress, history, epoch, first=epoch == start_epoch, evaluate=control.evaluate
        )
        if config.checkpoint_dir:
            trainer.before_save()
        state.save_epoch(epoch + 1)  # --checkpoint-dir
    finish(trainer, config, data, history, count_bytes)
    return history


def replay(trainer: Trainer, config: Config, data: Dataset, state: TrainingState, control: RunControl, history):
    """The replay (shared/run/replay.py): with control.replay_state, the steps before control.replay_step from the
    initial state, written there; then that step's taps, into history.taps. Nothing else is trained."""
    if control.replay_state is not None:
        doing(trainer, f"training up to step {control.replay_step}")
        batches = global_batches(config, data)
        for _ in range(control.replay_step):
            trainer.step(*next(batches))
        if control.replay_step:
            state.write(control.replay_state, control.replay_step)
    else:
        batches = global_batches(config, data, control.replay_step)
    doing(trainer, f"replaying step {control.replay_step}")
    history.taps = trainer.taps(*next(batches))
    history.taps.step = control.replay_step


def doing(trainer: Trainer, what: str) -> None:
    """What a trainer process's parent names if this process dies."""
    status(f"{trainer.name} on {trainer.placement}: {what}")


def train_and_evaluate(
    trainer, config: Config, data: Dataset, progress: Progress, history, epoch: int, first: bool, evaluate: bool = True
):
    """One epoch's steps, timed apart from the evaluation after them (`evaluate`; else no test metrics), into
    `history`."""
    steps = len(batch_slices(len(data.y_train), config.batch_size))
    progress.epoch_started(f"{trainer.name} epoch {epoch + 1}/{config.epochs}", steps)
    meter = EpochMeter(progress.steps_done)
    traces_before = trainer.trace_count()
    doing(trainer, f"tracing the train step, epoch {epoch + 1}" if first else f"training epoch {epoch + 1}")
    trainer.train_epoch(epoch, meter, first=first, record_state=config.dtype == "float64")
    finished = meter.finish()  # before evaluating: the epoch's time is training only
    traces = trainer.trace_count() - traces_before
    if first:
        history.trace_seconds = trainer.probed_seconds + meter.call_seconds[0]  # the first call: a step, its trace
        if trainer.steps_give_gradients:
            history.first_step_gradients = trainer.first_call_gradients()
    test_loss = test_accuracy = None
    if evaluate:
        doing(trainer, f"evaluating after epoch {epoch + 1}")
        test_loss, test_accuracy = step.evaluate(trainer, data.x_test, data.y_test, host_label_count(data.y_test))
    record = history.add_epoch(epoch + 1, meter, finished, test_loss, test_accuracy, traces)
    progress.epoch_done(trainer.name, record, config.epochs)


def finish(trainer: Trainer, config: Config, data: Dataset, history: History, count_bytes: Callable) -> None:
    """After the last epoch: the final state and weights, memory, --export, and the bytes per step (or --profile)."""
    doing(trainer, "reading the final weights")
    if config.dtype == "float64":
        history.add_final_state(read_state_checksums(trainer.state()))
    history.final_weights = trainer.final_weights()
    history.memory_per_device = step.memory_per_device(trainer)
    clipping = clipping_record(trainer.optimizer)
    if clipping:
        history.details["clipping"] = clipping
    history.skipped_steps = skipped_steps(trainer.optimizer)
    if history.skipped_steps is not None:
        history.details["loss scaling"] = loss_scale_record(trainer.optimizer)
    trainer.finish(history)
    definition = trainer.model.definition
    export_trainer(
        config, trainer.name, definition, history.final_weights, trainer.predict_logits, data.x_test, history.details
    )
    history.collectives = trainer.collectives
    doing(trainer, "profiling a step" if config.profile else "counting the bytes a step sends")
    if config.profile:  # last: it steps the weights on, after every figure of the run is recorded
        history.step_profile, history.traffic, history.traffic_missing = profile.measure(
            trainer.step_call(), lambda: count_bytes(trainer)
        )
    elif config.dtype == "float64":  # the call that ran also checksums the state; counting a plain one traces anew
        history.traffic_missing = (
            "not counted: a float64 run's steps checksum the state too (--profile counts a plain step)"
        )
    else:  # the bytes per step alone, counted in the functions that ran: no step is run for them
        history.traffic, history.traffic_missing = count_bytes(trainer)
