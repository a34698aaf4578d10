"""The parity bound per float dtype, in a module of the standard library alone: release_matrix/table.py judges a
release's restores with it where neither numpy nor TensorFlow is installed."""

# One bound T per dtype, measured on every mesh and replica count, run lengths up to 320 steps and
# learning rates up to 1e4 (docs/parity.md): T on the loss, the gradients and the state checksums,
# 10 T on the final weights (a ReLU flip moves a weight by a whole Adam step). float32: the 1e-4 the
# check has always used, now with a relative part. float64: 100x above the largest noise measured and
# far below the smallest real difference seen (docs/parity.md has the figures). The state checksums
# (sum |x| of values from 1e-16 to 1e5) are judged relatively only.
FLOAT_TOLERANCE = {"float32": 1e-4, "float64": 1e-7}
