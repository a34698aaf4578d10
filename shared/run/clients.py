"""Several processes, one training run: multi-client DTensor and MultiWorkerMirroredStrategy.

    python compare.py --clients 2 --devices 2 --data embedded

Launcher (no cluster variables set): checks, runs the reference itself, then for each distributed
trainer starts C client processes on free loopback ports, inside one private network namespace where the
system allows it (shared/run/network.py; the header says which), each handed the run's Config as JSON,
relays client 0's lines, reads every client's result and reports. Client (DTENSOR_* or TF_CONFIG
set, by the launcher or a real cluster): trains one trainer as one client. A client that dies or
does not start ends its group, and the trainer is FAILED in one line. docs/multi-machine.md.
"""

import atexit
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.console import fit_width, print_fitted
from dtensor_vs_mirrored.shared.devices import configure_determinism, configure_devices
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.files import write_atomically
from dtensor_vs_mirrored.shared.judge.parity import max_abs_diff
from dtensor_vs_mirrored.shared.report import outputs
from dtensor_vs_mirrored.shared.report.header import header
from dtensor_vs_mirrored.shared.run import children, client_config
from dtensor_vs_mirrored.shared.run.comparison import check_trainer_options, prepare
from dtensor_vs_mirrored.shared.run.network import PrivateNetwork
from dtensor_vs_mirrored.shared.run.plan import Entry, RunPlan, lineup
from dtensor_vs_mirrored.shared.run.sequence import TrainerResult, in_process, train_and_judge, train_one
from dtensor_vs_mirrored.shared.training.data import load_run_data
from dtensor_vs_mirrored.shared.training.protocol import PLAIN_RUN, ClusterRole
from dtensor_vs_mirrored.shared.training.registry import (
    chosen,
    describe_runs,
    distributed,
    specs,
    trainer_spec,
    with_trainers,
)

HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 60  # spawn to "started" (TensorFlow imported); a client slower than this counts as dead
FINISH_GRACE_S = 30  # once one client has finished, the others must finish within this
POLL_S = 0.1  # the watchdog's period: how soon a dead client is noticed


# --- the environment a client reads (each trainer's spec.cluster knows its own variables) ---------


def _shown(variables) -> str:
    """How messages name a trainer's variables: "TF_CONFIG", or "DTENSOR_*" for several with one prefix."""
    return variables[0] if len(variables) == 1 else os.path.commonprefix(list(variables)) + "*"


def role_from_environment(config: Config, environ=os.environ) -> Optional[Tuple[str, ClusterRole]]:
    """This process's place in a cluster, from the variables of the trainer whose are set, and that trainer; None when
    none is."""
    clustered = {spec.name: spec.cluster.variables for spec in specs() if spec.cluster is not None}
    present = [name for name, variables in clustered.items() if any(v in environ for v in variables)]
    if len(present) > 1:
        named = [(_shown(clustered[name]), name) for name in present]
        raise UsageError(
            f"both {' and '.join(shown for shown, _ in named)} are set; a client process runs one distributed "
            f"trainer: set {' or '.join(f'{shown} for {name}' for shown, name in named)}"
        )
    if not present:
        return None
    trainer = present[0]
    role = trainer_spec(trainer).cluster.role(config, environ)
    if role.num_clients != config.clients:
        raise UsageError(
            f"--clients {config.clients} but {role.source} describes {role.num_clients} "
            f"clients; use --clients {role.num_clients}"
        )
    if not 0 <= role.client_id < role.num_clients:
        raise UsageError(f"{role.source}: client {role.client_id} is not in 0..{role.num_clients - 1}")
    return trainer, role


def client_environment(trainer: str, client_id: int, ports: Sequence[int]) -> Dict[str, str]:
    """The variables that make a process client `client_id` of len(ports) on this host."""
    return trainer_spec(trainer).cluster.environment(client_id, [f"{HOST}:{port}" for port in ports])


def free_ports(count: int) -> List[int]:
    """`count` distinct TCP ports that nothing listens on now (the OS picks them; all held until chosen)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("", 0))  # every interface: TensorFlow's gRPC server binds them all
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def run(config: Config, result_file: Optional[str] = None, command: Sequence[str] = ()) -> int:
    """compare.py --clients C: a client when the environment names one, else the launcher. `result_file`: where a
    client that the launcher started writes its result (the launcher hands it over with the Config); `command`:
    how the launcher starts a client, the command line's own program (it adds --client-config FILE)."""
    config = with_trainers(config)
    found = role_from_environment(config)
    if found is None:
        check_trainer_options(config)  # the launcher's, before anything is written or started (a client runs one)
        if result_file:
            raise UsageError("--client-config is for the clients that --clients starts; drop it")
        return run_launcher(config, command)
    trainer, role = found
    return run_client(config, trainer, role, result_file)


# --- a client -------------------------------------------------------------------------------


def run_client(config: Config, trainer: str, role: ClusterRole, result_file: Optional[str] = None) -> int:
    """Train `trainer` as client `role` of its cluster; under the launcher, write the result file."""
    others = [name for name in distributed(chosen(config)) if name != trainer]
    if others:
        raise UsageError(
            f"this process is {trainer} client {role.client_id} ({role.source} is set) "
            f"and runs one distributed trainer; use --trainers {trainer} here and run "
            f"{','.join(others)} as its own job"
        )
    if not result_file:
        outputs.check_outputs(config)
    configure_determinism(config.deterministic)  # before any op runs
    devices = configure_devices(config.devices, config.device_type)
    if result_file:
        write_atomically(result_file + ".started", b"")
    join_cluster(config, trainer, role)
    data = load_run_data(config)
    if not result_file and role.client_id == 0:
        print(header(config, devices, data, describe_runs(config)))
    result = train_one(trainer, config, data, devices, log=print_fitted)
    if result_file:
        write_atomically(result_file, pickle.dumps(result))
        return 1 if result.failed else 0
    if role.client_id != 0:
        print(
            f"{trainer} client {role.client_id} of {role.num_clients}: "
            f"{'FAILED: ' + result.error if result.failed else 'finished'}; client 0 prints the comparison"
        )
        return 1 if result.failed else 0
    trained_here = in_process(data, devices)

    def train(entry: Entry, run_config: Config, control=PLAIN_RUN) -> TrainerResult:  # this client's is trained
        return result if entry.trainer == trainer else trained_here(entry, run_config, control)

    plan = RunPlan(
        config=config,
        data=data,
        devices=devices,
        entries=lineup(config.replace(trainers=("reference", trainer))),
        train=train,
        no_float64_reason="this client cannot restart the others; run every client again with --dtype float64",
    )
    run = train_and_judge(plan)
    return outputs.publish(config, run)


def join_cluster(config: Config, trainer: str, role: ClusterRole) -> None:
    """Join the cluster (it blocks until every client has); a port taken is one line."""
    try:
        trainer_spec(trainer).cluster.join(config)
    except Exception as error:  # re-raised unless it is the port: TensorFlow says only "Could not start gRPC server"
        if "could not start grpc server" not in str(error).lower():
            raise
        raise UsageError(
            f"{trainer} client {role.client_id}: could not listen on {role.address} (port in use?); "
            f"free it or give this client another port in {role.addresses_in}"
        ) from None


# --- the launcher ---------------------------------------------------------------------------


def run_launcher(config: Config, command: Sequence[str]) -> int:
    """Check, run the reference here, each distributed trainer in C processes, then report."""
    outputs.check_outputs(config)
    devices, data = prepare(config)
    devices = devices[: config.devices]
    print(header(config, devices, data, describe_runs(config)))
    clients_line = (
        f"clients: {config.clients} processes x {config.devices} logical {config.device_type}s on {HOST}; "
        f"each feeds its share of every global batch; the reference runs in this process"
    )
    print(fit_width(clients_line, indent=2))
    network = PrivateNetwork()  # off the network where the system allows it (shared/run/network.py)
    network.start()
    atexit.register(network.stop)
    print(fit_width(network.describe(), indent=2))
    signal.signal(signal.SIGTERM, _on_sigterm)  # compare.py runs this in its main thread
    workdir = tempfile.mkdtemp(prefix="compare-clients-")
    trained_here, launched = in_process(data, devices), []

    def train(entry: Entry, run_config: Config, control=PLAIN_RUN) -> TrainerResult:  # the others as clients
        if not trainer_spec(entry.trainer).distributes:
            return trained_here(entry, run_config, control)
        launched.append(entry.key)  # each launch's files apart: a float64 rerun's from the float32 run's
        directory = os.path.join(workdir, f"launch-{len(launched)}")
        os.makedirs(directory)
        return launch(entry.trainer, run_config, data.source, directory, command, network)

    try:  # Ctrl-C, or SIGTERM (see _on_sigterm), unwinds through here: the client processes are stopped already
        run = train_and_judge(RunPlan(config=config, data=data, devices=devices, entries=lineup(config), train=train))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        network.stop()
    return outputs.publish(config, run)


def launch(
    trainer: str,
    config: Config,
    data_source: str,
    workdir: str,
    program: Sequence[str],
    network: Optional[PrivateNetwork] = None,
):
    """Run `trainer` in config.clients processes, each `program --client-config FILE` (inside `network`'s
    namespace, if it holds one); client 0's result, or a failed one with one line."""
    for attempt in (1, 2):
        group = ClientGroup(trainer, config.clients, workdir, attempt)
        try:
            group.start(config, data_source, program, network)
            error = group.watch()
        finally:
            group.stop()
        if not error:
            return group.result()
        if attempt == 1 and "port in use" in error:
            print(f"{trainer}: a port was taken before its client bound it; once more on new ports")
            continue
        return TrainerResult(trainer, error=error)


class ClientGroup:
    """C client processes of one trainer, each in its own process group, and their files."""

    def __init__(self, trainer: str, count: int, workdir: str, attempt: int):
        self.trainer, self.count = trainer, count
        stem = os.path.join(workdir, f"{trainer}-{attempt}")
        self.result_files = [f"{stem}-client{client}.pkl" for client in range(count)]
        self.stdout_files = [f"{stem}-client{client}.out" for client in range(count)]
        self.stderr_files = [f"{stem}-client{client}.err" for client in range(count)]
        self.processes: List[subprocess.Popen] = []
        self.relayed = 0  # bytes of client 0's stdout printed so far

    def start(
        self, config: Config, data_source: str, program: Sequence[str], network: Optional[PrivateNetwork]
    ) -> None:
        ports = free_ports(self.count)
        cluster = {v for spec in specs() if spec.cluster is not None for v in spec.cluster.variables}
        for client in range(self.count):
            env = {name: value for name, value in os.environ.items() if name not in cluster}
            env.update(client_environment(self.trainer, client, ports), PYTHONUNBUFFERED="1")
            # The run's configuration whole: this trainer only, the data source already resolved.
            run_config = config.replace(trainers=(self.trainer,), data=data_source)
            config_file = self.result_files[client] + ".config.json"
            client_config.write(config_file, run_config, self.result_files[client])
            command = [*program, "--client-config", config_file]
            command = network.command(command) if network else command  # nsenter execs it: the same pid
            with open(self.stdout_files[client], "wb") as out, open(self.stderr_files[client], "wb") as err:
                # It dies with the launcher, however that ends; the paths it is given are read from this directory.
                keywords = dict(stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=os.getcwd())
                self.processes.append(children.start(command, env, die_with_parent=True, **keywords))
        print(
            f"{self.trainer}: {self.count} clients on {HOST}:{','.join(map(str, ports))}, "
            f"pids {','.join(str(p.pid) for p in self.processes)}",
            flush=True,
        )

    def watch(self) -> str:
        """Wait until every client has finished (""), or one line saying which one did not."""
        started = time.monotonic()
        first_finished = None
        while True:
            self.relay()
            codes = [process.poll() for process in self.processes]
            failed = [client for client, code in enumerate(codes) if code not in (None, 0)]
            if failed:  # a client killed by a signal is the cause; the others' errors follow from it
                client = min(failed, key=lambda c: (codes[c] >= 0, c))
                return (
                    f"{self.trainer} client {client} (pid {self.processes[client].pid}) "
                    f"{self.describe_exit(client)}; stopped the other clients"
                )
            if all(code == 0 for code in codes):
                self.relay()
                missing = [str(c) for c, path in enumerate(self.result_files) if not os.path.exists(path)]
                return f"{self.trainer} client {','.join(missing)} exited without a result" if missing else ""
            now = time.monotonic()
            not_started = [
                str(c)
                for c, code in enumerate(codes)
                if code is None and not os.path.exists(self.result_files[c] + ".started")
            ]
            if not_started and now - started > STARTUP_TIMEOUT_S:
                return (
                    f"{self.trainer} client {','.join(not_started)} did not start within "
                    f"{STARTUP_TIMEOUT_S} s; stopped every client"
                )
            if first_finished is None and 0 in codes:
                first_finished = now
            if first_finished is not None and now - first_finished > FINISH_GRACE_S:
                running = [str(c) for c, code in enumerate(codes) if code is None]
                return (
                    f"{self.trainer} client {','.join(running)} still running {FINISH_GRACE_S} s after "
                    f"another finished; stopped it"
                )
            time.sleep(POLL_S)

    def describe_exit(self, client: int) -> str:
        code = self.processes[client].returncode
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        if os.path.exists(self.result_files[client]):  # the trainer raised: its own one-line reason
            with open(self.result_files[client], "rb") as f:
                return f"failed: {pickle.load(f).error}"
        with open(self.stderr_files[client], "rb") as err:
            lines = [line.strip() for line in err.read().decode(errors="replace").splitlines() if line.strip()]
        last = lines[-1] if lines else "no error output"
        return f"exited with code {code}: {last[:300]}"

    def relay(self) -> None:
        """Print client 0's new complete lines (its epoch lines), as they come."""
        with open(self.stdout_files[0], "rb") as out:
            out.seek(self.relayed)
            text = out.read()
        complete = text[: text.rfind(b"\n") + 1]
        if complete:
            sys.stdout.write(complete.decode(errors="replace"))
            sys.stdout.flush()
            self.relayed += len(complete)

    def stop(self) -> None:
        """Every client still running killed at once, and each reaped: TensorFlow catches a client's SIGTERM once it
        has joined its cluster (shared/run/children.py GRACE_S), so a grace would only keep the launcher waiting."""
        children.stop(self.processes, grace_s=0)

    def result(self):
        """Client 0's TrainerResult, with how far the other clients' final weights are from it."""
        results = []
        for path in self.result_files:
            with open(path, "rb") as f:
                results.append(pickle.load(f))  # written by our own client processes
        first = results[0]
        spread = max(
            (max_abs_diff(other.history.final_weights, first.history.final_weights) for other in results[1:]),
            default=0.0,
        )
        first.history.details["client_weight_spread"] = f"{spread:.3g}"
        first.history.details["clients"] = str(self.count)
        return first


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt("terminated (SIGTERM)")  # unwinds through ClientGroup.stop like Ctrl-C
