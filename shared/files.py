"""Files written so that a failure never leaves half of one, and the checks on output directories.

A file goes to a temporary name in its directory and is renamed into place
(`write_atomically`); a directory of files (a checkpoint, a SavedModel) is written
beside its final name and renamed when complete (`partial_path`, `publish_directory`).
A rename within one directory is atomic, so readers see the old state or the new one.
"""

import os
import shutil
import tempfile

from dtensor_vs_mirrored.shared.errors import UsageError


def write_atomically(path: str, payload: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        os.fchmod(handle, 0o666 & ~current_umask())  # mkstemp makes it 0600; an ordinary file honours the umask
        with os.fdopen(handle, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def current_umask() -> int:
    """The process's umask (reading it means setting it: set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_writable_dir(flag: str, directory: str, create: bool) -> None:
    """UsageError in one line unless `directory` exists (made first if `create`) and is writable."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise UsageError(f"{flag}: {directory} is a file, not a directory; choose another path")
    if create:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as error:
            raise UsageError(
                f"{flag} {directory}: cannot create it ({error.strerror}); choose a writable directory"
            ) from None
    if not os.path.isdir(directory):
        raise UsageError(f"{flag}: directory {directory} does not exist; create it or choose another path")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"{flag}: directory {directory} is not writable; choose a writable path")


def _fsync(path: str) -> None:
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def publish_directory(partial: str, final: str) -> None:
    """Rename a fully written `partial` directory to `final` (same parent), replacing an old `final`.

    A replaced `final` is first renamed aside, so a kill between the two renames
    leaves the old copy under .<name>.replaced instead of a half-written one.
    """
    for root, _, files in os.walk(partial):
        for name in files:
            _fsync(os.path.join(root, name))
    _fsync(partial)
    parent, name = os.path.split(final)
    replaced = os.path.join(parent, f".{name}.replaced")
    if os.path.exists(final):
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(final, replaced)
    os.rename(partial, final)
    _fsync(parent)
    shutil.rmtree(replaced, ignore_errors=True)


def partial_path(final: str) -> str:
    """Where `final` is written before publish_directory renames it into place; a stale one is removed."""
    parent, name = os.path.split(final)
    partial = os.path.join(parent, f".{name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by a killed writer
    os.makedirs(partial)
    return partial
