"""A trainer process: trains trainers for the run one at a time, in a process of its own.

    python -m dtensor_vs_mirrored.shared.run.worker      # started by TrainerProcess, never by hand

Two reasons to train outside the run's process: a setting that TensorFlow fixes once per process (its
intra-op thread count: each approach gets the one that serves it, and the reference's runs the one its devices
have, so that it rounds as they do, docs/throughput.md), and a crash inside
TensorFlow (a segmentation fault in DTensor's SPMD expansion) that would otherwise take the whole
comparison with it. The process stays up between trainers, so TensorFlow starts once; one that
dies is the FAILED trainer's, with its signal and what it was doing, and the next trainer gets a new one.
Messages both ways are length-prefixed pickles over the process's stdin and a duplicate of its stdout.
"""

import atexit
import os
import pickle
import signal
import struct
import subprocess
import sys
from typing import Callable, Dict, NoReturn, Optional, Sequence

from dtensor_vs_mirrored.shared.console import hide_tensorflow_messages
from dtensor_vs_mirrored.shared.run import children

HEADER = struct.Struct("<Q")  # each message's length
FINISH_S = 30  # a process told to finish (close) gets this long to end its job, then it is stopped
VERBOSE = "COMPARE_WORKER_VERBOSE"  # "1": the process shows TensorFlow's own lines, as --verbose does


def send(stream, message) -> None:
    payload = pickle.dumps(message)
    stream.write(HEADER.pack(len(payload)) + payload)
    stream.flush()


def receive(stream):
    """The next message, or None at the end of the stream (the other side has gone)."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (length,) = HEADER.unpack(header)
    payload = stream.read(length)
    return None if len(payload) < length else pickle.loads(payload)


class TrainerProcess:
    """The parent's side: one trainer process with its own environment (e.g. TF_NUM_INTRAOP_THREADS)."""

    def __init__(self, environment: Dict[str, str], device_count: int):
        self.environment, self.device_count = dict(environment), device_count
        self.process: Optional[subprocess.Popen] = None
        self.sent_data = None  # the Dataset the process holds: sent once, kept alive here so its identity holds

    def start(self) -> None:
        self.sent_data = None  # a new process holds no data yet
        env = dict(os.environ, **self.environment)
        command = [sys.executable, "-m", "dtensor_vs_mirrored.shared.run.worker"]
        self.process = children.start(command, env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def started(self) -> "TrainerProcess":
        """Started now, if it is not running: it loads TensorFlow while this process works on."""
        if self.process is None or self.process.poll() is not None:
            self.start()
        return self

    def train(self, name: str, config, data, log: Callable[[str], None], control=None):
        """Train `name` there (`control`: shared.training.protocol.RunControl, None for a plain run); a TrainerResult,
        FAILED with the signal and the last status if the process died."""
        from dtensor_vs_mirrored.shared.errors import UsageError
        from dtensor_vs_mirrored.shared.run.results import TrainerResult

        self.started()
        status, token = "starting TensorFlow", None
        try:
            if self.sent_data is not data:  # the data goes once to each process, not with every job
                send(self.process.stdin, ("data", data))
                self.sent_data = data
            send(self.process.stdin, ("train", name, config, self.device_count, control))
        except OSError:  # it died before it could read the job (a broken pipe)
            return TrainerResult(name, error=self.death(status))
        while True:
            try:
                message = receive(self.process.stdout)
                kind, value = (None, None) if message is None else message
            except Exception as error:  # noqa: BLE001 - whatever a broken stream unpickles to: that trainer's FAILED
                broke = f"its messages broke off ({type(error).__name__}: {str(error)[:120]})"
                return TrainerResult(name, error=self.death(status, broke))
            if message is None:
                return TrainerResult(name, error=self.death(status))
            if kind == "line":
                log(value)
            elif kind == "status":
                status = value
            elif kind == "usage":
                raise UsageError(*value)  # its message and field, for the front end to word
            elif kind == "kept":
                token = value
            else:
                value.kept = None if token is None else KeptThere(self, token)
                return value

    def time(self, token: int, steps: int):
        """A timed round (shared.measure.timing.TimedRound) of the trainer kept there as `token`; None if it is gone."""
        try:
            send(self.process.stdin, ("time", token, steps))
            message = receive(self.process.stdout)
        except Exception as error:  # noqa: BLE001 - a broken stream: no figure, and the process is stopped
            self.death("timing a kept trainer", f"its messages broke off ({type(error).__name__})")
            return None
        if message is None:
            self.death("timing a kept trainer")
            return None
        return message[1]

    def release(self, token: int) -> None:
        if self.process is not None and self.process.poll() is None:
            send(self.process.stdin, ("release", token))

    def death(self, status: str, broke: str = "") -> str:
        """One line: how the process ended, and what the trainer was doing; `broke`: why this side stopped it (its
        messages broke off), which is then the line's cause."""
        if not broke:
            self.process.wait()  # it ended on its own: its code says how, not a stop's
        children.stop([self.process])  # stopped if it runs on, reaped, its pipes closed
        code, self.process, self.sent_data = self.process.returncode, None, None
        if broke:
            return f"{broke} while {status}; its process was stopped"
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return f"its process {how} while {status}"

    def finish(self) -> None:
        """Told to finish: its stdin closed, it exits after the job it is on (close waits for that)."""
        if self.process is not None and self.process.poll() is None:
            self.process.stdin.close()

    def close(self) -> None:
        self.sent_data = None
        if self.process is not None:
            self.finish()
            try:
                self.process.wait(timeout=FINISH_S)
            except subprocess.TimeoutExpired:
                pass  # stopped now
            children.stop([self.process])
        self.process = None


class KeptThere:
    """The parent's handle on a trainer kept in a trainer process (shared.run.results.TrainerResult.kept)."""

    def __init__(self, owner: TrainerProcess, token: int):
        self.owner, self.token, self.process = owner, token, owner.process

    def time(self, steps: int):
        """A timed round of its steady call; None when its process has gone since."""
        return self.owner.time(self.token, steps) if self.owner.process is self.process else None

    def release(self) -> None:
        if self.owner.process is self.process:
            self.owner.release(self.token)


_processes: Dict[tuple, TrainerProcess] = {}  # one per environment, kept for the next run in this process


def trainer_process(environment: Dict[str, str], config, device_count: int, lane: int = 0) -> TrainerProcess:
    """The trainer process for `environment` (and op determinism, process-wide like it), started on its first
    train call and kept: a second run, a sweep's next configuration or a float64 rerun finds TensorFlow started.
    A request for more devices than it has replaces it. `lane`: a sweep's second lane gets a process of its own
    (shared/run/lanes.py)."""
    key = (tuple(sorted(environment.items())), config.deterministic, config.device_type, config.verbose, lane)
    found = _processes.get(key)
    if found is None or found.device_count < device_count:
        if found is not None:
            found.close()
        extra = {VERBOSE: "1"} if config.verbose else {}
        if lane:  # one progress bar on a terminal: the first lane's
            from dtensor_vs_mirrored.shared.report.progress import NO_PROGRESS_BAR

            extra[NO_PROGRESS_BAR] = "1"
        found = _processes[key] = TrainerProcess({**environment, **extra}, device_count)
    return found


@atexit.register
def close_all() -> None:
    """Every trainer process told to finish (its stdin closed), then each waited for: they end side by side, not one
    after the other (each ends at once: main)."""
    processes = list(_processes.values())
    for trainer_process in processes:
        trainer_process.finish()
    for trainer_process in processes:
        trainer_process.close()
    _processes.clear()


def serve(jobs, replies) -> None:
    """The child's side: train each job as it comes, until the parent closes stdin."""
    from dtensor_vs_mirrored.shared import console
    from dtensor_vs_mirrored.shared.errors import UsageError

    console.status_sink = lambda text: send(replies, ("status", text))
    started, kept, data = False, {}, None
    while True:
        job = receive(jobs)
        if job is None:
            return
        if job[0] == "data":  # the run's data, once, for the jobs after it
            data = job[1]
            continue
        if job[0] != "train":
            keep(job, kept, replies)
            continue
        _, name, config, device_count, control = job
        if not started:
            start_tensorflow(config, device_count)
            started = True
        from dtensor_vs_mirrored.shared.run.results import train_one
        from dtensor_vs_mirrored.shared.training.protocol import PLAIN_RUN

        devices = [f"{config.device_type}:{index}" for index in range(config.devices)]
        try:
            log = lambda line: send(replies, ("line", line))  # noqa: E731 - each line to the parent as it comes
            result = train_one(name, config, data, devices, log, control or PLAIN_RUN)
        except UsageError as error:  # the parent raises it, as train_one would have there
            send(replies, ("usage", (error.message, error.field)))
            continue
        if result.kept is not None:
            kept[len(kept) + 1] = result.kept
            send(replies, ("kept", len(kept)))
        send(replies, ("result", result))


def keep(job, kept: dict, replies) -> None:
    """The child's side of a kept trainer: ("time", token, steps) answers a timed round (None if it failed: the run
    then measures that trainer by its epochs); ("release", token) lets it go."""
    if job[0] == "release":
        kept[job[1]].release()
        kept[job[1]] = None  # its token stays counted: the next trainer kept gets a new one
        return
    try:
        timed = kept[job[1]].time(job[2])
    except Exception:  # noqa: BLE001 - a round that fails is no figure, not a failed trainer
        timed = None
    send(replies, ("timed", timed))


def start_tensorflow(config, device_count: int) -> None:
    """What the run's own process does before anything trains: determinism, the trainers' pre-runtime
    settings, the logical devices."""
    from dtensor_vs_mirrored.shared.devices import configure_determinism, configure_devices
    from dtensor_vs_mirrored.shared.training.registry import chosen, specs

    configure_determinism(config.deterministic)
    for spec in specs(chosen(config)):
        spec.before_runtime(config, device_count)
    configure_devices(device_count, config.device_type)


def main(argv: Sequence[str] = ()) -> NoReturn:
    replies = os.fdopen(os.dup(1), "wb")  # the messages' own channel: stray prints go to stderr instead
    os.dup2(2, 1)
    # TensorFlow's lines are hidden here even where TF_CPP_MIN_LOG_LEVEL is set (the parent shows its own if so):
    # its first ones ignore the level, and a run's output must not depend on a second process.
    hide_tensorflow_messages(verbose=os.environ.get(VERBOSE) == "1", environ={})
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when this process ends
    import tensorflow  # noqa: F401 - now, while the parent works on (a lane started early: train_all)

    serve(sys.stdin.buffer, replies)
    # Every reply is flushed as it is sent, and a job's files (checkpoints, exports) are written before its result:
    # this process ends here, its exit handlers run (autograph's remove its generated files) and its output
    # flushed, rather than winding TensorFlow down, which took seconds at the end of every run that used it.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
