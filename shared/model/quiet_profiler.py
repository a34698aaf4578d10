"""TensorFlow's v1 profiler, which counts a Keras model's float operations, without its deprecation warnings.

Its flops registry calls `tensor_shape_from_node_def_name`, deprecated "designed for TensorFlow v1", and TensorFlow
logs that as a WARNING on the "tensorflow" logger: in a user's pytest it lands in the captured log or the console
about the project's own call, never about their model. Only those records are dropped, only during the count.
"""

import contextlib
import logging

DEPRECATED_IN_PROFILER = "tensor_shape_from_node_def_name"


class _ProfilerDeprecations(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return DEPRECATED_IN_PROFILER not in record.getMessage()


@contextlib.contextmanager
def profiler_deprecations_dropped():
    """The "tensorflow" logger drops the profiler's deprecation warning meanwhile; every other record passes."""
    logger, dropped = logging.getLogger("tensorflow"), _ProfilerDeprecations()
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)
