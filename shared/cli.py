"""Train MNIST with DTensor, MirroredStrategy and one plain device; check they agree.

    python compare.py                       # the tutorial's settings: 8 logical CPUs, 3 epochs
    python compare.py --trainers reference --data embedded
    python compare.py --clients 2 --devices 2   # 2 processes x 2 logical CPUs (shared/run/clients.py)
    python compare.py --baseline a.json         # also against a report saved by --json (shared/judge/baseline.py)
    python compare.py --help

Every trainer starts from the same initial values and sees the same global batches; the per-step losses,
first-step gradients and final weights of the distributed trainers are checked against the single-device
reference. Prints the run's facts once, one line per epoch per trainer, then the parity and results tables. A
float32 failure reruns in float64 to tell float noise from a real difference (shared/judge/verdict.py).
Exit code 0 when every verdict is ok or float noise (and none CHANGED against --baseline), 1 for a MISMATCH, a
diverged run, a failed trainer or a CHANGED one, 2 on bad input (one line), 3 when compare.py itself fails (one
line; the traceback goes to a file).
"""

import argparse
import dataclasses
import os
import sys
import tempfile
import time
import traceback
from typing import Optional, Tuple

from dtensor_vs_mirrored.shared.config import Config, option_flag
from dtensor_vs_mirrored.shared.console import hide_tensorflow_messages
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.run import children, client_config, kernels
from dtensor_vs_mirrored.shared.run.fit_options import check_fit_options
from dtensor_vs_mirrored.shared.run.run_options import check_run_options
from dtensor_vs_mirrored.shared.training.trainer_names import SPEC_MODULES, check_trainer_names


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):
        """Append the default unless the help already states it ("(default: ..." or "; default: ...")."""
        text = action.help or ""
        return text if "(default" in text or "default:" in text else super()._get_help_string(action)


class _ParserExit(Exception):
    """argparse is done: an error (status 2, one line) or --help (status 0, printed already)."""

    def __init__(self, status: int, message: str = ""):
        super().__init__(message)
        self.status, self.message = status, message


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """One line, exit code 2 (argparse would print the whole usage first)."""
        self.exit(2, f"{self.prog}: error: {message}; see --help\n")

    def exit(self, status=0, message=None):
        """Raise instead of sys.exit, so that main() returns the code to a Python caller as for any bad input."""
        raise _ParserExit(status, message or "")


def build_parser() -> argparse.ArgumentParser:
    """One option per Config field that has a help text, in the fields' groups and order (shared/config.py)."""
    parser = _Parser(prog="compare.py", description=__doc__.split("\n")[0], formatter_class=_HelpFormatter)
    parser.add_argument("--client-config", help=argparse.SUPPRESS)  # the --clients launcher's Config, as JSON
    groups = {}
    for field in dataclasses.fields(Config):
        group = field.metadata["group"]
        if group not in groups:
            groups[group] = parser.add_argument_group(group)
        groups[group].add_argument(option_flag(field.name), dest=field.name, **_keywords(field))
    return parser


def _keywords(field: dataclasses.Field) -> dict:
    """add_argument's keywords for a field: a bool is a switch that flips its default, anything else takes a value."""
    declared = field.metadata
    if isinstance(field.default, bool):
        return {"action": "store_false" if field.default else "store_true", "help": declared["help"]}
    default = field.default  # None for every tuple (--trainers, --hidden, --sweep-devices): their help says it
    help = declared["help"].replace("{trainers}", ",".join(SPEC_MODULES))  # --trainers': the registry's names
    keywords = {"type": declared["parse"], "default": default, "help": help}
    return {**keywords, "metavar": declared["metavar"]} if declared["metavar"] else keywords


def config_from_args(args: argparse.Namespace) -> Tuple[Config, Optional[str]]:
    """The Config that the flags describe (every flag's dest is a Config field), and where a --clients client
    writes its result (None for any other process); UsageError if bad."""
    if args.client_config:  # a client of the --clients launcher: its whole configuration, as the launcher made it
        return client_config.read(args.client_config)
    fields = {field.name for field in dataclasses.fields(Config)}
    config = Config(**{name: value for name, value in vars(args).items() if name in fields})
    check_trainer_names(config.trainers)  # before --clients starts a process: the launcher's config is checked here
    check_run_options(config)
    check_fit_options(config)
    return config, None


# How the --clients launcher starts each client: this module, by the project's unique name, wherever it is installed.
CLIENT_COMMAND = (sys.executable, "-m", "dtensor_vs_mirrored.shared.cli")
INTERNAL_ERROR = 3  # compare.py itself failed: neither a verdict (0, 1) nor bad input (2)


def main(argv=None, restore_stderr: bool = True) -> int:
    """compare.py's exit code: 0 parity holds (or --help), 1 it does not, 2 bad input (one line on stderr),
    3 an internal error (one line on stderr; the traceback in a file, and on stderr too with --verbose).
    Never raises SystemExit, so a Python caller gets the same codes as the command line. `restore_stderr`: put
    descriptor 2 and sys.stderr back when it returns, for a Python caller's next lines; the command line keeps
    TensorFlow's lines hidden to its exit (those its shutdown prints)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return run_command(argv, restore_stderr)
    except Exception as error:  # noqa: BLE001 - anything else is compare.py's own failure: exit 3, never exit 1
        return internal_error(error, argv)


def internal_error(error: Exception, argv) -> int:
    """One line on stderr naming the error and the file that holds its traceback; INTERNAL_ERROR."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    message = (str(error).splitlines() or [""])[0][:300]
    where = os.path.join(
        tempfile.gettempdir(), f"compare-internal-error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    )
    try:
        from dtensor_vs_mirrored.shared.files import write_atomically

        write_atomically(where, f"compare.py {' '.join(map(str, argv))}\nPython {sys.version}\n\n{text}".encode())
        kept = f"traceback in {where}"
    except OSError as write_error:
        kept, argv = f"traceback below: {where} could not be written ({write_error.strerror})", [*argv, "--verbose"]
    print(f"compare.py: internal error: {type(error).__name__}: {message} ({kept})", file=sys.stderr)
    if "--verbose" in argv:
        print(text, end="", file=sys.stderr)
    return INTERNAL_ERROR


def run_command(argv, restore_stderr: bool = True) -> int:
    """main's work; an exception that is not bad input leaves it as an internal error."""
    try:
        config, result_file = config_from_args(build_parser().parse_args(argv))
    except _ParserExit as done:
        print(done.message, end="", file=sys.stderr)
        return done.status
    except UsageError as error:  # a value Config refuses, or options that do not go together
        see_help = "; see --help" if error.field else ""  # one option's value, as argparse's own errors
        print(f"compare.py: error: {error}{see_help}", file=sys.stderr)
        return 2
    restore = hide_tensorflow_messages(config.verbose)
    kernels.start(config)  # a mixed run's matmul probe imports TensorFlow beside this process's import of it
    try:
        # These import TensorFlow: after argument errors are reported, and after its messages are hidden.
        from dtensor_vs_mirrored.shared.run import clients, comparison

        if config.clients > 1:  # several processes: the launcher starts them, or this is one of them
            return clients.run(config, result_file, CLIENT_COMMAND)
        return comparison.run(config)
    except UsageError as error:
        print(f"compare.py: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C (or SIGTERM under --clients): no process it started outlives the run
        children.stop_all()
        raise
    finally:
        if restore_stderr:
            restore()  # a Python caller's stderr is its own again (main(argv) a second time, its own lines)


INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended


def interrupted(interrupt: KeyboardInterrupt) -> int:
    """The command line's one line for an interrupted run: the outputs are written at the end, each whole, so
    before then nothing is (shared/report/outputs.py says which were, if it came while they were written)."""
    why = interrupt.args[0] if interrupt.args else "interrupted"
    writing = type(interrupt).__name__ == "InterruptedWhileWriting"
    print(f"compare.py: {why}" if writing else f"compare.py: {why}: nothing written", file=sys.stderr)
    return INTERRUPTED


def command() -> None:
    """`python compare.py` and the installed `dtensor-vs-mirrored` command: main's exit code, Ctrl-C as one line."""
    try:
        sys.exit(main(restore_stderr=False))
    except KeyboardInterrupt as interrupt:
        sys.exit(interrupted(interrupt))


if __name__ == "__main__":
    command()
