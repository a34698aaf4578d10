"""The project's error type: bad input that the user can fix.

Every check that rejects a flag, a file or a device request raises `UsageError`
with one line that names the value and says what would work; `compare.py`
prints that line and exits with code 2, without a traceback.
"""


class UsageError(Exception):
    """Bad input; the message is one line that says what to fix."""
