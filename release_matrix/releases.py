"""The TensorFlow releases the project supports: the one list the release matrix runs (noxfile.py).

The newest patch of every minor release from the oldest that works to the newest.
pyproject.toml declares the same range (`tensorflow>=OLDEST_MINOR,<NEXT_MINOR`), and
tests/test_releases.py fails when the two disagree. Why the range starts where it does:
docs/releases.md.
"""

RELEASES = ("2.12.1", "2.13.1", "2.14.1", "2.15.1", "2.16.2", "2.17.1", "2.18.1", "2.19.1", "2.20.0", "2.21.0")
# The release on which release_matrix/baseline-float64.json was made: every release's float64 run is compared with it.
BASELINE_RELEASE = "2.21.0"
