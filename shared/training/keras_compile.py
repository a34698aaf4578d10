"""The user's compile settings rebuilt for a --fit run in its dtype: the loss and the optimizer in float64 for a
float64 run, a loss given by name or as a function too, and the metrics as they were (float32: they are logs).

Keras builds a loss given by name or as a function when model.fit first runs, in the floatx of that moment
(float32), not of compile: a float64 run would compute such a loss in float32 and judge float32's rounding (8.9e-8
between one device and MirroredStrategy for "sparse_categorical_crossentropy"). So the loss is resolved here, as
Keras resolves it, into a loss object of the run's dtype. A metric judges nothing, and some have no float64 kernel
(top-k's InTopKV2): they keep their own dtype and compute on a cast of the outputs.
"""

import copy

from dtensor_vs_mirrored.shared.model.keras import widened

KERAS_CHOOSES_BY_SHAPE = ("crossentropy", "ce")  # names compile resolves from the labels' and outputs' shapes


def in_run_dtype(settings: dict, dtype: str, keras) -> dict:
    """compile's arguments from the user's compile config: in float64, the optimizer and loss widened and a loss
    given by name or as a function made a loss object of that dtype (call under keras.config.set_floatx(dtype))."""
    settings = copy.deepcopy(settings)
    if dtype != "float64":
        return keras.saving.deserialize_keras_object(settings)
    metrics = {key: settings.pop(key, None) for key in METRIC_ARGUMENTS}
    arguments = keras.saving.deserialize_keras_object(widened(settings))
    for key, given in keras.saving.deserialize_keras_object(metrics).items():
        arguments[key] = [on_float32(metric, keras) for metric in given] if isinstance(given, list) else given
    arguments["loss"] = loss_object(arguments.get("loss"), dtype, keras)
    return arguments


METRIC_ARGUMENTS = ("metrics", "weighted_metrics")
KERAS_CHOOSES_ACCURACY = ("accuracy", "acc")  # compile picks the accuracy from the shapes; any dtype computes it


def on_float32(metric, keras):
    """A metric of a float64 run computing in float32 on a cast of the outputs, logged under its own name."""
    if isinstance(metric, str) and metric.lower() in KERAS_CHOOSES_ACCURACY:
        return metric
    if isinstance(metric, str) or not isinstance(metric, keras.metrics.Metric) and callable(metric):
        found = keras.metrics.get(metric)
        name = metric if isinstance(metric, str) else getattr(found, "__name__", "metric")
        metric = found if isinstance(found, keras.metrics.Metric) else keras.metrics.MeanMetricWrapper(found, name)
    if not isinstance(metric, keras.metrics.Metric):
        return metric
    return float32_metric(keras)(metric)


def float32_metric(keras):
    class OnFloat32(keras.metrics.Metric):
        """`inner` fed the outputs cast to float32 (its variables tracked as this metric's, its result its own)."""

        def __init__(self, inner):
            super().__init__(name=inner.name, dtype="float32")
            self.inner = inner

        def update_state(self, y_true, y_pred, sample_weight=None):
            return self.inner.update_state(y_true, keras.ops.cast(y_pred, "float32"), sample_weight)

        def result(self):
            return self.inner.result()

        def reset_state(self):
            self.inner.reset_state()

    return OnFloat32


def loss_object(loss, dtype: str, keras):
    """`loss` as a keras.losses.Loss of `dtype`: a name or a function resolved as compile does (keras.losses.get,
    then Keras's LossFunctionWrapper, which matches the labels' rank to the outputs' as compile's does)."""
    if loss is None or isinstance(loss, keras.losses.Loss) or not isinstance(loss, str) and not callable(loss):
        return loss  # a loss object is deserialized in the run's dtype already; a dict or list of losses as it is
    if isinstance(loss, str) and loss.lower() in KERAS_CHOOSES_BY_SHAPE:
        return loss
    resolved = keras.losses.get(loss)
    if isinstance(resolved, keras.losses.Loss):
        return resolved
    from keras.src.losses.losses import LossFunctionWrapper  # compile's own wrapper (checked on Keras 3.15.1)

    name = loss if isinstance(loss, str) else getattr(resolved, "__name__", "loss")
    return LossFunctionWrapper(resolved, name=name, dtype=dtype)
