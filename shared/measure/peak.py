"""The machine's matmul peak in the run's dtype: what compare.py prints beside each trainer's achieved GFLOP/s.

    achieved GFLOP/s = examples/s x the model's flops_per_example / 1e9

Each model counts its own FLOPs per example (shared/model/mlp.py: 3 x 2 x weights, the usual
convention, not a measurement). The peak is a 2048 x 2048 matmul in the run's dtype (a float64
run's is its own: 11-13 GFLOP/s against float32's 34-36 on the 2-core test machine) in a
tf.function on one device, best of a few repeats: ~1 s (float64 ~3 s), run in the same
process as the trainers, so a loaded machine lowers both.
"""

import time

import tensorflow as tf

PEAK_MATMUL_SIZE = 2048
PEAK_REPEATS = 5


def matmul_peak_gflops(
    device: str = "CPU:0", size: int = PEAK_MATMUL_SIZE, repeats: int = PEAK_REPEATS, dtype: str = "float32"
) -> float:
    """The best GFLOP/s of a size x size matmul in `dtype` (the run's --dtype) on `device` over `repeats` calls."""
    with tf.device(device):
        a = tf.random.stateless_uniform((size, size), seed=(1, 2), dtype=dtype)
        b = tf.random.stateless_uniform((size, size), seed=(3, 4), dtype=dtype)
        matmul = tf.function(tf.matmul)
        matmul(a, b).numpy()  # trace and warm up
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            matmul(a, b).numpy()  # host sync: the matmul has run
            best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e9
