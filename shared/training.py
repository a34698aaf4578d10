"""The training run every trainer shares: restore, first-step gradients, epochs, evaluation, checkpoints.

Written once, as Orbit's StandardTrainer and torchtitan's Trainer.train() are: `fit` calls the
parts a trainer supplies (what distributing changes: where the variables live, the train step,
the evaluation, reading the weights back). The parts, and what each must do: docs/trainers.md.
"""

from typing import Callable

from shared import profile
from shared.checkpoint import TrainingState
from shared.checksums import read_state_checksums, state_names, state_sizes
from shared.config import Config
from shared.data import MnistData, batch_slices, epoch_batches
from shared.export import export_trainer
from shared.history import EpochMeter, History, format_epoch_line


def fit(trainer, config: Config, data: MnistData, log: Callable = print) -> History:
    """Train `trainer` for config.epochs (from --restore's epoch) and return its history record."""
    history = History(
        trainer=trainer.name, placement=trainer.placement, dtype=config.dtype, details=dict(trainer.details)
    )
    definition = trainer.model.definition
    record_state = config.dtype == "float64"  # per-step state checksums: what parity names when it fails
    if record_state:
        history.state_names = state_names(definition, trainer.optimizer)
        history.state_sizes = state_sizes(definition, trainer.optimizer)
    state = TrainingState(trainer.name, config, *trainer.checkpointed, len(data.y_train), log)
    start_epoch = state.restore()  # --restore: epochs already trained; 0 without
    getattr(trainer, "begin", lambda start_epoch: None)(start_epoch)
    first_x, first_y = next(
        epoch_batches(data.x_train, data.y_train, config.batch_size, start_epoch, config.shuffle, config.seed)
    )
    history.first_step_gradients = trainer.gradients(first_x, first_y)

    steps = len(batch_slices(len(data.y_train), config.batch_size))
    for epoch in range(start_epoch, config.epochs):
        meter = EpochMeter(f"{trainer.name} epoch {epoch + 1}/{config.epochs}", steps)
        traces_before = trainer.trace_count()
        trainer.train_epoch(epoch, meter, first=epoch == start_epoch, record_state=record_state)
        finished = meter.finish()  # before evaluating: the epoch's time is training only
        traces = trainer.trace_count() - traces_before
        if epoch == start_epoch:
            history.trace_seconds = meter.call_seconds[0]  # the first call: one step and its tracing
        test_loss, test_accuracy = trainer.evaluate(data.x_test, data.y_test)
        record = history.add_epoch(epoch + 1, meter, finished, test_loss, test_accuracy, traces)
        if not config.quiet:
            log(format_epoch_line(trainer.name, record, config.epochs))
        if config.checkpoint_dir:
            getattr(trainer, "before_save", lambda: None)()
        state.save_epoch(epoch + 1)  # --checkpoint-dir
    if record_state:
        history.add_final_state(read_state_checksums(trainer.state()))
    history.final_weights = trainer.final_weights()
    history.memory_per_device = trainer.memory_per_device()
    getattr(trainer, "finish", lambda history: None)(history)
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
    if config.profile:  # last: it steps the weights on, after every figure of the run is recorded
        history.step_profile, history.traffic, history.traffic_missing = profile.measure(trainer.step_call())
    return history
