"""Keras's own `model.fit` as a trainer (--fit): on one device it is the reference, under MirroredStrategy
(mirrored_impl/keras_fit.py) it is judged against it, as most TensorFlow users who distribute train.

    python compare.py --model examples/keras_fit.py:global_clipnorm --fit --data embedded --devices 4 --dtype float64

The user's model is rebuilt from its config under the strategy's scope (every float32 dtype float64 for --dtype
float64), given the definition's initial values, compiled with the user's own compile settings (the tool's
optimizer and softmax cross-entropy when the function did not compile it) and trained by model.fit, one call an
epoch, on every trainer's global batches. A callback resets Keras's metrics as each batch starts, so that the
batch's logs hold that step's loss alone, as Keras computed and differentiated it: no running mean to undo.
What differs under a strategy, and why (mirrored_impl/fit_cautions.py): docs/keras.md, "model.fit under
MirroredStrategy".
"""

import contextlib
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.measure import profile, traffic
from dtensor_vs_mirrored.shared.measure.checksums import state_checksums, state_variables
from dtensor_vs_mirrored.shared.model import keras_compat
from dtensor_vs_mirrored.shared.model.keras import is_seed_state, own_policy, rebuilt
from dtensor_vs_mirrored.shared.model.keras_inputs import keras_arrangement
from dtensor_vs_mirrored.shared.model.registry import definition_for
from dtensor_vs_mirrored.shared.training import batch_inputs
from dtensor_vs_mirrored.shared.training.batches import epoch_batches, without_autotune
from dtensor_vs_mirrored.shared.training.keras_compile import in_run_dtype
from dtensor_vs_mirrored.shared.training.losses import correct_count, host_label_count, loss_sum
from dtensor_vs_mirrored.shared.training.protocol import Trainer

ACCURACY = "compare_accuracy"  # the tool's one metric, added to the user's: the train_acc column
CLIPPING = ("clipnorm", "global_clipnorm", "clipvalue")  # a Keras optimizer's clipping settings


def keras_module():
    import keras  # imported where --fit trains, not by every run

    return keras


class FitModel(tf.Module):
    """The Keras model as the shared loop and checkpoints see it: the definition and the variables in its order."""

    def __init__(self, definition, keras_model):
        super().__init__()
        self.definition, self.keras = definition, keras_model

    @property
    def ordered(self) -> list:
        """The Keras variables in the definition's order: trainable, then the running statistics."""
        running = [v for v in self.keras.non_trainable_variables if not is_seed_state(v)]
        return list(self.keras.trainable_variables) + running

    @property
    def weights(self) -> list:
        return [variable.value for variable in self.ordered]


class FitOptimizer(tf.Module):
    """The model's Keras optimizer as the loop sees it: its variables, and an Adam's m and v in the weights' order
    (named as the project's Adam slots are in parity's messages)."""

    def __init__(self, keras_optimizer):
        super().__init__()
        self.keras = keras_optimizer
        self.clip_norm = None  # --clip-global-norm's: Keras's own clipping is the compile settings'
        inner = getattr(keras_optimizer, "inner_optimizer", keras_optimizer)  # a LossScaleOptimizer's Adam
        slots = keras_compat.adam_slots(inner)
        if slots is not None:  # Keras's Adam
            self.m, self.v = ([slot.value for slot in moments] for moments in slots)

    @property
    def variables(self) -> list:
        return [variable.value for variable in self.keras.variables]


def compile_settings(source) -> Optional[dict]:
    """The user's compile settings as Keras serialises them; None when the function did not compile the model."""
    return source.get_compile_config() if getattr(source, "compiled", False) else None


def check_fit_model(config: Config) -> None:
    """--fit's model: a Keras model whose compile settings rebuild and record one loss a step; UsageError else."""
    if not config.fit:
        return
    definition = definition_for(config)
    if definition.keras_model is None:
        raise UsageError(
            f"--fit trains a Keras model with its own model.fit; --model {config.model} gives a ModelDefinition: "
            f"return the built Keras model instead (docs/keras.md)"
        )
    settings = compile_settings(definition.keras_model) or {}
    if settings.get("steps_per_execution", 1) != 1:
        raise UsageError(
            f"--fit: the model is compiled with steps_per_execution={settings['steps_per_execution']}, and each "
            f"step's loss is recorded after it: compile it with steps_per_execution=1"
        )
    with tf.device("/CPU:0"):
        compile_like(rebuilt(definition.keras_model, keras_module(), config.model, None), definition, config)


def tool_compile(config: Config, keras) -> dict:
    """compile's arguments when the user's function did not compile the model: the run's optimizer (the project's
    Adam constants) and the softmax cross-entropy of logits every trainer of the project's trains."""
    if config.optimizer == "sgd":
        optimizer = keras.optimizers.SGD(config.learning_rate)
    else:
        optimizer = keras.optimizers.Adam(config.learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-7)
    return {"optimizer": optimizer, "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}


def compile_like(model, definition, config: Config) -> None:
    """`model` compiled as the user's function compiled theirs (their optimizer, loss, metrics; or tool_compile),
    its loss, loss tracker and metrics in the run's dtype, with the tool's accuracy metric added."""
    keras = keras_module()
    settings = compile_settings(definition.keras_model)
    floatx = keras.config.floatx()
    keras.config.set_floatx(config.weight_dtype)  # Keras's losses and metrics compute in floatx unless told otherwise
    try:
        arguments = tool_compile(config, keras) if settings is None else in_run_dtype(settings, config.dtype, keras)
        metrics, accuracy = arguments.get("metrics"), accuracy_metric(definition, keras)
        if accuracy is not None and (metrics is None or isinstance(metrics, (list, tuple))):
            arguments["metrics"] = [*(metrics or []), accuracy]
        model.compile(**arguments)
    except Exception as error:  # noqa: BLE001 - the user's compile settings: any error is one line
        raise UsageError(
            f"--fit: the model's compile settings could not be rebuilt from its compile config ({type(error).__name__}:"
            f" {str(error).splitlines()[0] if str(error) else ''}); give custom losses and metrics get_config"
        ) from None
    finally:
        keras.config.set_floatx(floatx)


def accuracy_metric(definition, keras):
    """The tool's accuracy as a Keras metric, counting what shared/training/losses.py correct_count counts: the
    arg-max class, a binary output above its threshold, None for a regression (no accuracy)."""
    if definition.targets == "classes":
        return keras.metrics.SparseCategoricalAccuracy(name=ACCURACY)
    if definition.targets == "binary":
        return keras.metrics.BinaryAccuracy(name=ACCURACY, threshold=definition.binary_threshold)
    return None


def fit_model(definition, config: Config, strategy=None):
    """The user's model for model.fit: rebuilt under `strategy`'s scope (None: on the current device), the
    definition's initial values (widened exactly in float64), compiled as theirs, its optimizer built."""
    keras, source = keras_module(), definition.keras_model
    dtype = None if own_policy(source) == config.dtype else config.dtype  # the model as it is, in its own policy
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        keras.utils.set_random_seed(config.seed)
        model = rebuilt(source, keras, config.model, dtype)
        for mine, theirs in zip(model.variables, source.variables, strict=True):
            mine.assign(np.asarray(theirs.numpy()).astype(mine.dtype))  # the user's values, every process alike
        compile_like(model, definition, config)
        model.optimizer.build(model.trainable_variables)
    return model


class LossScaleSteps:
    """Keras's LossScaleOptimizer, step by step (mixed_float16 under --fit): the scale each step multiplied its loss
    by, and the steps it skipped (its iterations did not move: a non-finite gradient by its check)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.scales: List[float] = []
        self.skipped: List[int] = []

    def begin(self) -> None:
        self.scale = float(self.optimizer.dynamic_scale.numpy())
        self.iterations = int(self.optimizer.iterations.numpy())

    def end(self) -> None:
        if int(self.optimizer.iterations.numpy()) == self.iterations:
            self.skipped.append(len(self.scales))
        self.scales.append(self.scale)

    def record(self, history) -> None:
        history.step_loss_scales, history.skipped_step_indices = list(self.scales), list(self.skipped)
        history.skipped_steps = len(self.skipped)
        scale = float(self.optimizer.dynamic_scale.numpy())
        steps = f"step {', '.join(map(str, self.skipped[:8]))}" if self.skipped else "none"
        history.details["loss scaling"] = (
            f"Keras's LossScaleOptimizer: loss scale {scale:g}, {len(self.skipped)} of {len(self.scales)} steps "
            f"skipped (a non-finite gradient by its check): {steps}"
        )


def step_recorder(meter, counts: Sequence[int], state: Optional[list], scaling: Optional[LossScaleSteps] = None):
    """A Keras callback that resets the model's metrics as each batch starts (with `state`, checksumming the state
    it starts from, float64 runs) and adds the batch's loss and correct count to `meter` as it ends; each batch is
    timed from its start to its end, so that an epoch's time is its steps', not its model.fit call's set-up and
    wind-down (under MirroredStrategy most of a short epoch's call: docs/throughput.md)."""
    keras = keras_module()

    class StepRecorder(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            for metric in self.model.metrics:
                metric.reset_state()  # the loss tracker's and the metrics' running means start over
            self.checksums = state_checksums(state) if state else None
            if scaling is not None:
                scaling.begin()
            meter.step_begins()  # what came before, model.fit's set-up included, is no step's time

        def on_train_batch_end(self, batch, logs=None):
            if scaling is not None:
                scaling.end()
            count = counts[batch]
            correct = float(logs.get(ACCURACY, 0.0)) * count  # none: a regression, no accuracy
            meter.add(float(logs["loss"]), correct, count, self.checksums)

    return StepRecorder()


class KerasFitTrainer(Trainer):
    """The parts shared.training.loop.fit calls, each epoch one model.fit call: on one device here, under
    MirroredStrategy in mirrored_impl/keras_fit.py (`place`)."""

    name = "reference"

    def __init__(self, config: Config, data, devices: Sequence[str], log=print):
        self.config, self.data, self.device = config, data, devices[0]
        self.definition = definition_for(config)
        self.strategy, self.placement, self.collectives = self.place(devices)
        keras_model = fit_model(self.definition, config, self.strategy)
        self.model, self.optimizer = FitModel(self.definition, keras_model), FitOptimizer(keras_model.optimizer)
        self.arrange = keras_arrangement(keras_model)  # several named inputs as Keras takes them
        self.checkpointed = (self.model, self.optimizer)
        is_scaled = hasattr(keras_model.optimizer, "dynamic_scale")  # mixed_float16: compile's LossScaleOptimizer
        self.scaling = LossScaleSteps(keras_model.optimizer) if is_scaled else None
        self.details = {
            "loop": f"Keras {keras_module().__version__} model.fit, one call an epoch",
            "compile": describe_compile(self.definition, config),
            "step_losses": "each batch's loss as Keras computed it: its metrics reset as the batch starts",
        }

    def place(self, devices: Sequence[str]):
        """(strategy or None, placement, collectives): one device, no strategy."""
        return None, f"model.fit on 1 x {self.device.split(':')[0]} ({self.device})", traffic.ONE_DEVICE

    def gradients(self, x, y):
        """The gradients of the loss Keras's train step differentiates (each replica's mean divided by the replica
        count, summed), at the current weights, before its optimizer's clipping; no state changes."""
        return [g.numpy() for g in keras_gradients(self.model.keras, self.strategy, self.arrange(x), y)]

    def taps(self, x, y):
        raise NotImplementedError("--fit: Keras's model.fit is not replayed (no taps)")

    def step(self, x, y):
        self.model.keras.train_on_batch(self.arrange(x), y)

    def train_epoch(self, epoch: int, meter, first: bool, record_state: bool):
        config = self.config
        batches = list(
            epoch_batches(self.data.x_train, self.data.y_train, config.batch_size, epoch, config.shuffle, config.seed)
        )
        inputs = (self.arrange(batch_inputs.joined([x for x, _ in batches])), np.concatenate([y for _, y in batches]))
        dataset = tf.data.Dataset.from_tensor_slices(inputs).batch(config.batch_size).with_options(without_autotune())
        counts = [host_label_count(y) for _, y in batches]
        recorder = step_recorder(meter, counts, self.state() if record_state else None, self.scaling)
        self.model.keras.fit(
            dataset, epochs=epoch + 1, initial_epoch=epoch, verbose=0, callbacks=[recorder], shuffle=False
        )

    def finish(self, history) -> None:
        if self.scaling is not None:
            self.scaling.record(history)

    def trace_count(self) -> int:
        return 0  # Keras's train function is its own: it traces in the first epoch, on the same shapes every epoch

    def step_call(self, most_steps: int = 0) -> profile.StepCall:
        raise NotImplementedError("--fit: no --profile of Keras's model.fit")

    def test_batches(self, x, y):
        return epoch_batches(x, y, self.config.batch_size)

    def test_step(self, batch):
        x, y = batch
        logits = self.model.keras(self.arrange(x), training=False)
        return loss_sum(logits, y, None, self.definition.loss), correct_count(logits, y, None, self.definition)

    def state(self):
        return state_variables(self.model, self.optimizer)

    def final_weights(self):
        return [np.asarray(weight.numpy()) for weight in self.model.weights]

    def predict_logits(self, x):
        return self.model.keras.predict(self.arrange(x), verbose=0)


def keras_gradients(model, strategy, x, y):
    """The first step's gradients as Keras's train step takes them (model.compute_loss on the forward in training,
    each replica's piece as tf.data's rebatch cuts it, summed over the replicas), from model.stateless_call: the
    running statistics are not updated."""
    trainable = list(model.trainable_variables)

    def on_replica(x, y):
        values = [tf.convert_to_tensor(variable.value) for variable in trainable]
        state = [tf.convert_to_tensor(variable.value) for variable in model.non_trainable_variables]
        with tf.GradientTape() as tape:
            tape.watch(values)
            y_pred, _ = model.stateless_call(values, state, x, training=True)
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred, training=True)
        gradients = [tf.convert_to_tensor(g) for g in tape.gradient(loss, values)]
        context = tf.distribute.get_replica_context()
        return context.all_reduce(tf.distribute.ReduceOp.SUM, gradients) if strategy is not None else gradients

    if strategy is None:
        return tf.function(on_replica)(batch_inputs.each(tf.constant, x), tf.constant(y))
    pieces = next(iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors((x, y)))))
    summed = tf.function(lambda pieces: strategy.run(on_replica, args=pieces))(pieces)
    return [strategy.experimental_local_results(g)[0] for g in summed]


def describe_compile(definition, config: Config) -> str:
    """What model.fit trains with, for the header and the details: whose compile settings, the optimizer and its
    clipping, the loss."""
    settings = compile_settings(definition.keras_model)
    if settings is None:
        return (
            f"compiled by the tool: {config.optimizer} lr {config.learning_rate:g}, "
            f"SparseCategoricalCrossentropy(from_logits=True)"
        )
    optimizer, loss = settings.get("optimizer"), settings.get("loss")
    options = optimizer.get("config", {}) if isinstance(optimizer, dict) else {}
    shown = [f"lr {options['learning_rate']:g}"] if isinstance(options.get("learning_rate"), float) else []
    shown += [f"{name}={options[name]:g}" for name in CLIPPING if options.get(name) is not None]
    name = optimizer.get("class_name") if isinstance(optimizer, dict) else optimizer
    loss_name = loss.get("class_name") if isinstance(loss, dict) else loss
    if isinstance(loss, dict) and loss.get("config", {}).get("from_logits"):
        loss_name += "(from_logits=True)"
    return f"compiled by your function: {' '.join([name, ', '.join(shown)]).strip()}; loss {loss_name}"
