"""This project's import name: `from dtensor_vs_mirrored.shared.api import check_model`.

The repository keeps its folders at its root (shared/, dtensor_impl/, mirrored_impl/); installed or cloned, they
are this package's subpackages, so that a package of your own named `shared` (a common name) and this
one's never mix. In a clone or an editable install this package's path is the repository's root; a wheel holds them
inside it (pyproject.toml's package-dir).
"""

import os

_HERE = os.path.dirname(os.path.abspath(__file__))
if not os.path.isdir(os.path.join(_HERE, "shared")):  # a clone or an editable install: the folders are beside it
    __path__.append(os.path.dirname(_HERE))

# The directory that holds this package: what a child process (a trainer process, a --clients client) needs on its path.
IMPORT_ROOT = os.path.dirname(_HERE)
