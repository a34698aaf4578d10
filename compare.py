"""Train MNIST with DTensor, MirroredStrategy and one plain device; check they agree.

    python compare.py                       # the tutorial's settings: 8 logical CPUs, 3 epochs
    python compare.py --trainers reference --data embedded
    python compare.py --clients 2 --devices 2   # 2 processes x 2 logical CPUs (shared/multiclient.py)
    python compare.py --baseline a.json         # also against a report saved by --json (shared/baseline.py)
    python compare.py --help

Every trainer starts from the same initial values and sees the same global
batches; the per-step losses, first-step gradients and final weights of the
distributed trainers are checked against the single-device reference. Prints
the run's facts once, one line per epoch per trainer, then the parity and
results tables. When float32 parity fails, the reference and the failing trainers
are rerun in float64 to tell float noise from a real difference (shared/verdict.py).
Exit code 0 when every verdict is ok or float noise (and none is CHANGED against
--baseline), 1 for a MISMATCH, a diverged run, a failed trainer or a CHANGED one, 2 on
bad input.
"""

import argparse
import dataclasses
import sys

from shared.config import CHOICES, TRAINER_NAMES, Config
from shared.console import hide_tensorflow_messages
from shared.errors import UsageError


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):
        """Append the default unless the help already explains it."""
        text = action.help or ""
        return text if "default" in text else super()._get_help_string(action)


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


def _int_list(text: str):
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def _name_list(text: str):
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _choices(field: str) -> dict:
    """How --help shows a field's values; Config checks them (one place, the same error for the Python API)."""
    return {"metavar": "{" + ",".join(CHOICES[field]) + "}"}


def build_parser() -> argparse.ArgumentParser:
    defaults = Config()
    parser = _Parser(prog="compare.py", description=__doc__.split("\n")[0], formatter_class=_HelpFormatter)
    group = parser.add_argument_group
    add = group("what trains where").add_argument
    add(
        "--trainers",
        type=_name_list,
        default=",".join(defaults.trainers),
        help="comma-separated trainers to run: " + ",".join(TRAINER_NAMES),
    )
    add("--devices", type=int, default=defaults.devices, help="logical devices (per client)")
    add(
        "--clients",
        type=int,
        default=defaults.clients,
        help="processes, each with --devices logical devices: DTensor multi-client and "
        "MultiWorkerMirroredStrategy; started here on loopback ports unless the environment names "
        "this process's cluster (DTENSOR_CLIENT_ID.. or TF_CONFIG; docs/multi-machine.md)",
    )
    add("--client-config", help=argparse.SUPPRESS)  # the --clients launcher's Config for a client, as JSON
    add(
        "--device-type",
        **_choices("device_type"),
        type=str.upper,
        default=defaults.device_type,
        help="logical CPUs (one physical CPU split) or GPUs (one physical GPU split if needed)",
    )
    add("--mesh", default=defaults.mesh, help="DTensor mesh batch=B[,model=M] (default: batch=DEVICES)")
    add = group("the training run (the same for every trainer)").add_argument
    add("--epochs", type=int, default=defaults.epochs, help="passes over the training set")
    add("--batch-size", type=int, default=defaults.batch_size, help="global batch size")
    add("--learning-rate", type=float, default=defaults.learning_rate, help="Adam or SGD step size")
    add(
        "--seed",
        type=int,
        default=defaults.seed,
        help="initial values use stateless seed (SEED, SEED+1); also the --shuffle seed",
    )
    add(
        "--optimizer",
        **_choices("optimizer"),
        default=defaults.optimizer,
        help="sgd exposes gradient-scale errors that Adam's normalisation hides",
    )
    add(
        "--adam",
        **_choices("adam"),
        default=defaults.adam,
        help="tutorial: the tutorial's Adam (read-after-assign, frozen step count)",
    )
    add(
        "--dtype",
        **_choices("dtype"),
        default=defaults.dtype,
        help="of weights, Adam slots and losses; float64 starts from the float32 initial values widened, "
        "and its parity is judged on every step with far tighter tolerances (docs/parity.md)",
    )
    add = group("data").add_argument
    add("--data", default=defaults.data, help="auto, tfds, embedded, or a directory of MNIST IDX files")
    add("--train-examples", type=int, default=None, help="training examples (default: tfds/IDX 5000, embedded 4000)")
    add("--test-examples", type=int, default=None, help="test examples (default: tfds/IDX 5000, embedded 1000)")
    add(
        "--model",
        default=defaults.model,
        help="mlp (the tutorial's), vit (a small Vision Transformer), or FILE.py:FUNCTION returning a "
        "shared.model.ModelDefinition (examples/my_model.py)",
    )
    add("--hidden", type=_int_list, default=None, help="the MLP's hidden layer sizes (default: 700,500)")
    add("--shuffle", action="store_true", help="reshuffle the training set every epoch from --seed")
    add = group("how each approach distributes").add_argument
    add(
        "--dtensor-input",
        **_choices("dtensor_input"),
        default=defaults.dtensor_input,
        help="DTensor input: split + dtensor.pack per batch, or dtensor.DTensorDataset",
    )
    add(
        "--no-dtensor-nccl",
        dest="dtensor_nccl",
        action="store_false",
        help="on GPUs, leave DTensor's collectives on TensorFlow's ring instead of NCCL (DTensor's own default; "
        "default: NCCL wherever TensorFlow allows it, one physical GPU per device; CPUs have no NCCL)",
    )
    add(
        "--mirrored-update",
        **_choices("mirrored_update"),
        default=defaults.mirrored_update,
        help="MirroredStrategy's optimizer step: once on the first device with the weights copied to the "
        "replicas, or on every replica after an all-reduce (auto: primary in one process, replicas "
        "with --clients)",
    )
    add = group("parity").add_argument
    add(
        "--tolerance",
        type=float,
        default=None,
        metavar="T",
        help="parity bound in the run's dtype: |a - b| <= T + T |b| for every step's loss and the first "
        "step's gradients, 10 T for the final weights (default: measured per dtype, docs/parity.md)",
    )
    add(
        "--no-explain",
        dest="explain",
        action="store_false",
        help="when float32 parity fails, do not rerun the reference and the failing trainers in float64 "
        "to tell float noise from a real difference; the verdict is then MISMATCH "
        "(default: rerun, exit 0 for float noise)",
    )
    add = group("reproducibility and baselines").add_argument
    add(
        "--baseline",
        metavar="REPORT.json",
        help="compare every trainer's losses and final weights with a report that --json wrote on another machine, "
        "release or commit: same, float noise or CHANGED (exit 1); a report of a run with other numeric "
        "options is refused, exit 2 (default: none)",
    )
    add(
        "--with-float64",
        action="store_true",
        help="also train every trainer in float64 and write it into --json's report, so that a later --baseline "
        "against it can tell float32 noise from a change; about doubles the training time",
    )
    add(
        "--repeat",
        type=int,
        default=defaults.repeat,
        metavar="N",
        help="train each trainer N times from the same start; report whether the runs are bitwise identical",
    )
    add(
        "--deterministic",
        action="store_true",
        help="tf.config.experimental.enable_op_determinism() for this process, before anything runs",
    )
    add = group("outputs").add_argument
    add("--json", metavar="PATH", help="write the JSON report here, atomically (default: none)")
    add(
        "--plots",
        metavar="DIR",
        help="write loss.png, accuracy.png, loss_diff.png, throughput.png here (default: none)",
    )
    add("--logdir", metavar="DIR", help="write TensorBoard scalars per trainer here (default: none)")
    add = group("speed").add_argument
    add(
        "--sweep-devices",
        type=_int_list,
        default=None,
        metavar="N,N,...",
        help="also measure throughput, parity and memory per device at each device count, e.g. 1,2,4,8; "
        "each configuration beside its own reference run (default: none)",
    )
    add(
        "--profile",
        action="store_true",
        help="after training, trace each trainer's steady train call with TensorFlow's profiler: a step's forward, "
        "backward, collectives, update, input and other time, and the bytes its collectives send per device "
        "(a few seconds per trainer; docs/throughput.md)",
    )
    add(
        "--link-gbps",
        type=float,
        default=None,
        metavar="G",
        help="with --profile, the least time those bytes take per step over links of G gigabits per second, e.g. "
        "your NVLink's or network's (default: none)",
    )
    add(
        "--sweep-meshes",
        **_choices("sweep_meshes"),
        default=defaults.sweep_meshes,
        help="all: DTensor on every batch x model mesh of each count and MirroredStrategy in each update "
        "mode; batch: DTensor on batch=N and MirroredStrategy's --mirrored-update only",
    )
    add = group("checkpoints and export").add_argument
    add(
        "--checkpoint-dir",
        metavar="DIR",
        help="after every epoch write each trainer's full state to DIR/<trainer>/epoch-NNNN, e.g. epoch-0001 "
        "(default: none)",
    )
    add(
        "--keep-checkpoints",
        type=int,
        default=defaults.keep_checkpoints,
        metavar="N",
        help="with --checkpoint-dir, keep each trainer's newest N epochs and delete older ones; 0 keeps all",
    )
    add(
        "--restore",
        metavar="PATH",
        help="start the trainers from a checkpoint any trainer wrote: DIR/<trainer>/epoch-NNNN, or DIR/<trainer> "
        "for its newest; --epochs stays the total (default: none)",
    )
    add(
        "--reference-from-scratch",
        action="store_true",
        help="with --restore: train the reference from the initial values for every epoch instead, and judge "
        "parity on the steps after the restore point: the resumed trainers against an uninterrupted run",
    )
    add(
        "--export",
        metavar="DIR",
        help="write each trainer's model as a SavedModel to DIR/<trainer>, servable without mesh or "
        "strategy (default: none)",
    )
    add = group("what is printed").add_argument
    add("--quiet", action="store_true", help="no per-epoch lines: the run's facts and the tables only")
    add(
        "--verbose",
        action="store_true",
        help="also show TensorFlow's own log lines (start-up, per-trace); hidden unless TF_CPP_MIN_LOG_LEVEL is set",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    """The Config that the flags describe (every flag's dest is a Config field); UsageError if bad."""
    if args.client_config:  # a client of the --clients launcher: its whole configuration, as the launcher made it
        with open(args.client_config) as file:
            return Config.from_json(file.read())
    fields = {field.name for field in dataclasses.fields(Config)}
    return Config(**{name: value for name, value in vars(args).items() if name in fields})


def main(argv=None) -> int:
    """compare.py's exit code: 0 parity holds (or --help), 1 it does not, 2 bad input (one line on stderr).
    Never raises SystemExit, so a Python caller gets the same codes as the command line."""
    try:
        config = config_from_args(build_parser().parse_args(argv))
    except _ParserExit as done:
        print(done.message, end="", file=sys.stderr)
        return done.status
    except UsageError as error:  # a value or a combination Config refuses
        see_help = "; see --help" if str(error).startswith("argument --") else ""
        print(f"compare.py: error: {error}{see_help}", file=sys.stderr)
        return 2
    hide_tensorflow_messages(config.verbose)
    # These import TensorFlow: after argument errors are reported, and after its messages are hidden.
    from shared import comparison, multiclient

    try:
        if config.clients > 1:  # several processes: the launcher starts them, or this is one of them
            return multiclient.run(config)
        return comparison.run(config)
    except UsageError as error:
        print(f"compare.py: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
