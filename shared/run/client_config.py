"""What the --clients launcher hands each client it starts (shared/run/clients.py): a JSON file, named by
`compare.py --client-config FILE`, holding the run's Config and where the client writes its result. Written and read
here only; light (no TensorFlow), since compare.py reads it before TensorFlow's messages are hidden."""

import json
from typing import Tuple

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.files import write_atomically
from dtensor_vs_mirrored.shared.run.options import config_from_json


def write(path: str, config: Config, result_file: str) -> None:
    write_atomically(path, json.dumps({"config": json.loads(config.to_json()), "result_file": result_file}).encode())


def read(path: str) -> Tuple[Config, str]:
    """The Config and the result file that `write` put in `path`; UsageError in one line for any other file."""
    try:
        with open(path) as file:
            text = file.read()
    except OSError as error:
        raise UsageError(
            f"--client-config {path}: cannot read it ({error.strerror or error}); "
            f"it is the file that the --clients launcher writes for each client"
        ) from None
    try:
        handed = json.loads(text)
    except ValueError as error:
        raise UsageError(f"--client-config {path}: not a configuration in JSON ({error})") from None
    if not isinstance(handed, dict) or set(handed) != {"config", "result_file"}:
        raise UsageError(
            f"--client-config {path}: not what the --clients launcher writes (its config and result_file); "
            f"it was written by another version of compare.py: write it again with this one"
        )
    try:
        return config_from_json(json.dumps(handed["config"])), handed["result_file"]
    except UsageError as error:
        raise UsageError(f"--client-config {path}: {error}") from None
