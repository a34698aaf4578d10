"""The yardstick for each trainer's achieved GFLOP/s: the fastest rate this run measured.

    achieved GFLOP/s = examples/s x the model's flops_per_example / 1e9

Each model counts its own FLOPs per example (shared/model/mlp.py: 3 x 2 x weights, the usual convention, not a
measurement: it counts work a step skips, such as the first layer's input gradient, so a trainer can beat a
matmul). The machine's matmul rate is measured in the run's dtype (float64's is a fraction of float32's) in a
tf.function on one device, best of a few repeats of each of PEAK_MATMUL_SIZES, a second or a few, in the same
process as the reference, after training. Since a trainer can beat that rate (and once read over 100% of a
"peak"), the yardstick is the larger of it and every trainer's, named for what it is: no trainer reads over 100%.
"""

import time
from typing import Dict, Optional, Tuple

import tensorflow as tf

PEAK_MATMUL_SIZES = (512, 1024, 2048)  # square matmuls, the trainers' sizes and above: the best counts
PEAK_REPEATS = 5


def matmul_peak_gflops(
    device: str = "CPU:0", sizes=PEAK_MATMUL_SIZES, repeats: int = PEAK_REPEATS, dtype: str = "float32"
) -> float:
    """The best GFLOP/s of a size x size matmul in `dtype` (the run's --dtype) on `device` over `repeats` calls of
    each of `sizes`."""
    return max(_matmul_gflops(device, size, repeats, dtype) for size in sizes)


def _matmul_gflops(device: str, size: int, repeats: int, dtype: str) -> float:
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


def yardstick(matmul_gflops: float, achieved: Dict[str, Optional[float]]) -> Tuple[float, str]:
    """(the fastest rate measured, what ran it): the matmul's, or a trainer's that beat it ("reference")."""
    fastest = max(((gflops, name) for name, gflops in achieved.items() if gflops is not None), default=(0.0, ""))
    return (matmul_gflops, "matmul") if matmul_gflops >= fastest[0] else fastest
