"""Mixed precision's tolerances and the verdict of its wider rerun.

A mixed run (--dtype mixed_bfloat16 or mixed_float16: float32 weights, the forward and backward in bfloat16 or
float16) is judged against the reference running the same policy on one device, with T = 4 epsilon of the compute
dtype: bfloat16 2**-8 -> 2**-6 = 1.6e-2, float16 2**-11 -> 2**-9 = 2.0e-3 (10 T on the final weights, as float32's).
4 epsilon is PyTorch's FSDP mixed-precision tests' bfloat16 rtol (1.6e-2) and sits beside tf-keras's distribution
tests' 1e-2 for float16 and bfloat16 policies and below Megatron-LM's 0.05; measured noise: docs/parity.md.

Beyond T, the reference and the failing trainers rerun the same steps in float32 from the same start: float32
within its own tolerance says the difference was the low precision's rounding (`bf16 noise` / `fp16 noise`); a
float32 rerun that leaves its tolerance too is rerun in float64, as a float32 run's failure is, and float64's
agreement gives the same noise verdict, its disagreement a MISMATCH.
"""

from typing import Dict, Optional, Tuple

from dtensor_vs_mirrored.shared.config import MIXED_COMPUTE

EPSILON = {"bfloat16": 2.0**-8, "float16": 2.0**-11}
EPSILONS_OF_TOLERANCE = 4
MIXED_TOLERANCE: Dict[str, float] = {
    policy: EPSILONS_OF_TOLERANCE * EPSILON[compute] for policy, compute in MIXED_COMPUTE.items()
}
# The verdict of a mixed run whose difference a wider rerun explained (compare.py exits 0 for it).
NOISE = {"mixed_bfloat16": "bf16 noise", "mixed_float16": "fp16 noise"}


def rerun_dtype(dtype: str) -> Optional[str]:
    """The dtype a failing run of `dtype` is rerun in to explain it: float64 for float32, float32 for a mixed
    policy; None for float64 (nothing wider)."""
    if dtype == "float32":
        return "float64"
    return "float32" if dtype in MIXED_COMPUTE else None


def noise_verdict(dtype: str) -> str:
    """`bf16 noise`, `fp16 noise` or `float noise`: what a difference explained by the wider rerun is called."""
    return NOISE.get(dtype, "float noise")


def left_tolerance(dtype: str) -> str:
    """How a verdict names the run that left its tolerance: "float32", "mixed_bfloat16 (bfloat16 compute)"."""
    return f"{dtype} ({MIXED_COMPUTE[dtype]} compute)" if dtype in MIXED_COMPUTE else dtype


def skip_difference(skipped: Optional[int], reference_skipped: Optional[int]) -> str:
    """mixed_float16: why a trainer's loss scaling skipped other steps than the reference's ("" when alike)."""
    if skipped == reference_skipped:
        return ""
    return (
        f"loss scaling skipped {skipped} steps, the reference {reference_skipped} (a non-finite combined gradient "
        f"where the reference's was finite, or the reverse)"
    )


def first_skip_difference(history, reference) -> Optional[Tuple[int, str]]:
    """(step, reason) of the first step that one side's loss scaling skipped and the other applied, from the
    per-step records (--fit under mixed_float16: Keras's LossScaleOptimizer); None when alike or not recorded."""
    steps = min(len(history.step_loss_scales), len(reference.step_loss_scales))
    mine, theirs = set(history.skipped_step_indices), set(reference.skipped_step_indices)
    for step in range(steps):
        if (step in mine) != (step in theirs):
            done = {True: "skipped it (a non-finite gradient by its check)", False: "applied it"}
            return step, (
                f"at step {step}: loss scaling: the reference {done[step in theirs]} at loss scale "
                f"{reference.step_loss_scales[step]:g}, this trainer {done[step in mine]} at loss scale "
                f"{history.step_loss_scales[step]:g}"
            )
    return None
