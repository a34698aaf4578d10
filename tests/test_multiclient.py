"""compare.py --clients: two local processes with two logical CPUs each, end to end.

Parity of multi-client DTensor (a batch=4 mesh over both processes) and of
MultiWorkerMirroredStrategy (2 workers) against the single-process reference, on the
same small run as test_compare.py; a client killed mid-run ends the run with exit 1
within the launcher's bound and leaves no process behind. Each client is a fresh
TensorFlow process (~5 s to start), so these are the slow tests: ~45 s and ~20 s on 2 cores.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.run.clients import (
    STARTUP_TIMEOUT_S,
    client_environment,
    free_ports,
    role_from_environment,
)
from dtensor_vs_mirrored.shared.run.network import PrivateNetwork
from tests.cli import ROOT, read_report

TWO_CLIENTS = [
    "--data",
    "embedded",
    "--train-examples",
    "256",
    "--test-examples",
    "64",
    "--epochs",
    "1",
    "--batch-size",
    "64",
    "--clients",
    "2",
    "--devices",
    "2",
]
KILL_BOUND_S = 60  # the issue's bound from a client's death to the launcher's exit


@pytest.mark.parametrize(
    "trainers, options",
    [
        ("dtensor", ["--shard-weights"]),  # each client holds its half of every weight and Adam slot
        pytest.param("dtensor,mirrored", [], marks=pytest.mark.extended),  # replicated, MultiWorkerMirrored too
    ],
)
def test_two_clients_match_the_reference_for_dtensor_and_multi_worker_mirrored(tmp_path, trainers, options):
    report_path = tmp_path / "report.json"
    result, listening = run_watching_listeners(*TWO_CLIENTS, "--trainers", trainers, *options, "--json", report_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.rstrip().endswith("PARITY OK")
    names = trainers.split(",")
    for name in names:
        assert re.search(rf"^{name}: 2 clients on 127\.0\.0\.1:\d+,\d+, pids \d+,\d+$", result.stdout, re.M)
        assert re.search(rf"^{name}\s+epoch 1/1  train_loss \d\.\d{{4}}", result.stdout, re.M)  # client 0's line
    check_the_header_says_where_the_clients_listened(result.stdout, listening, names)
    report = read_report(report_path)
    assert report["ok"] is True and report["config"]["clients"] == 2
    sharded = ", sharded" if options else ""
    placements = {
        "dtensor": f"mesh batch=4 over 2 clients x 2 CPU{sharded}",
        "mirrored": "2 replicas on CPU (2 workers)",
    }
    for name in names:
        assert report["trainers"][name]["placement"] == placements[name]
        assert len(report["trainers"][name]["step_losses"]) == 4  # 256 examples / batch 64, as the reference
        assert float(report["trainers"][name]["details"]["client_weight_spread"]) == 0.0  # both clients hold one model
    if options:  # client 0's 2 devices: a quarter of each weight (the 10 logits' bias whole), Adam's slots alike
        memory = report["trainers"]["dtensor"]["memory_per_device"]
        assert [entry["device"] for entry in memory] == ["CPU:0", "CPU:1"]
        assert all(entry["weight_bytes"] <= 4 * 905_010 // 4 + 4 * 10 for entry in memory)
        assert all(entry["optimizer_bytes"] == 2 * entry["weight_bytes"] + 8 for entry in memory)
        parity = report["parity"][name]
        assert parity["ok"] is True and parity["verdict"] == "ok"
        assert parity["max_abs_loss_diff"] <= parity["tolerances"]["loss"][0]
        print(
            f"{name}: loss {parity['max_abs_loss_diff']:.2e} grad {parity['max_abs_grad_diff']:.2e} "
            f"weight {parity['max_abs_weight_diff']:.2e}"
        )


def run_watching_listeners(*args):
    """compare.py as run_compare runs it, and per trainer's client group, once a client listens (seen from inside
    its network namespace, /proc/PID/net): (the port, the addresses the test's own namespace sees it listen on)."""
    env = dict({k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}, PYTHONPATH=ROOT)
    command = [sys.executable, os.path.join(ROOT, "compare.py"), *map(str, args)]
    stderr = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    lines, listening = [], {}

    def read():
        for line in process.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen = 0
    while reader.is_alive() or seen < len(lines):
        for line in lines[seen:]:
            match = re.match(r"(\w+): 2 clients on 127\.0\.0\.1:(\d+),\d+, pids (\d+),\d+$", line)
            if match:
                name, port, pid = match.group(1), int(match.group(2)), int(match.group(3))
                if wait_for_listener(pid, port):
                    listening[name] = (port, listeners(port, "/proc/self/net"))
        seen = len(lines)
        time.sleep(0.05)
    process.wait(timeout=60)
    stderr.seek(0)
    return subprocess.CompletedProcess(command, process.returncode, "".join(lines), stderr.read()), listening


def listeners(port: int, net: str) -> list:
    """The local addresses (hex, as /proc/net/tcp has them) that listen on `port` in the namespace of `net`."""
    found = []
    for table in ("tcp", "tcp6"):
        try:
            with open(os.path.join(net, table)) as file:
                rows = [row.split() for row in file.read().splitlines()[1:]]
        except FileNotFoundError:  # the process ended
            continue
        found += [row[1] for row in rows if row[3] == "0A" and int(row[1].rsplit(":", 1)[1], 16) == port]
    return found


def wait_for_listener(pid: int, port: int, seconds: float = 120) -> bool:
    """Whether client `pid` listens on `port` within `seconds` (False: it ended first)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _alive(pid):
        if listeners(port, f"/proc/{pid}/net"):
            return True
        time.sleep(0.05)
    return False


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1 as /proc/net/tcp{,6} write them


def check_the_header_says_where_the_clients_listened(stdout: str, listening: dict, names) -> None:
    """A private namespace: no client port open in the test's namespace. Else the header says every interface."""
    header = " ".join(stdout.split("reference  epoch 1/")[0].split())
    assert set(listening) == set(names), listening  # each group's client 0 was seen listening
    if "network: the clients share a private network namespace with loopback only" in header:
        assert {name: found for name, (_, found) in listening.items()} == {name: [] for name in names}
    else:  # e.g. a container without user namespaces: the header must say what the servers are open to
        assert re.search(
            r"network: no private network namespace here \(.+\); the clients' TensorFlow servers listen "
            r"on every interface, unauthenticated, while",
            header,
        ), header
        exposed = [address for _, found in listening.values() for address in found]
        assert [address for address in exposed if address.rsplit(":", 1)[0] not in LOOPBACK], exposed


def test_a_process_in_the_private_network_listens_where_no_other_machine_reaches_it():
    """Without TensorFlow: a server inside binds every interface, as TensorFlow's does, and this namespace sees no
    listener on its port; or, where there is no namespace to make, the header's line says so."""
    network = PrivateNetwork()
    try:
        if not network.start():
            assert network.describe().startswith(f"network: no private network namespace here ({network.why_not})")
            pytest.skip(f"no private network namespace here: {network.why_not}")
        server = subprocess.Popen(
            network.command([sys.executable, "-c", LISTEN_AND_WAIT]), stdout=subprocess.PIPE, stdin=subprocess.PIPE
        )
        try:
            port = int(server.stdout.readline())
            assert listeners(port, f"/proc/{server.pid}/net") and listeners(port, "/proc/self/net") == []
        finally:
            server.kill()
            server.wait()
    finally:
        network.stop()


LISTEN_AND_WAIT = """
import socket, sys
server = socket.create_server(("", 0))
print(server.getsockname()[1], flush=True)
sys.stdin.read()
"""


def test_where_no_namespace_can_be_made_the_header_says_the_servers_listen_on_every_interface(monkeypatch):
    from dtensor_vs_mirrored.shared.run import network as network_module

    refused = ["sh", "-c", "echo 'unshare: unshare failed: Operation not permitted' >&2; exit 1", "--"]
    monkeypatch.setattr(network_module, "UNSHARE", refused)
    network = PrivateNetwork()
    assert network.start() is False and network.command(["x"]) == ["x"]
    assert network.describe() == (
        "network: no private network namespace here (unshare: unshare failed: Operation not permitted); the "
        "clients' TensorFlow servers listen on every interface, unauthenticated, while each trainer's clients train: "
        "run this on an isolated network (docs/multi-machine.md)"
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie still answers kill(pid, 0)
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.extended  # the clients' parity: the test above
def test_a_client_killed_mid_run_stops_the_run_within_the_bound_and_leaves_no_process():
    command = [
        sys.executable,
        os.path.join(ROOT, "compare.py"),
        *TWO_CLIENTS,
        "--trainers",
        "dtensor",
        "--epochs",
        "20",
    ]  # longer than the test waits (the kill lands after epoch 1); the reference trains them all first
    launcher = subprocess.Popen(
        command,
        cwd=ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines, pids = [], []
    try:
        for line in launcher.stdout:  # until client 0 has trained an epoch with client 1
            lines.append(line)
            match = re.match(r"dtensor: 2 clients on \S+, pids (\d+),(\d+)$", line)
            if match:
                pids = [int(pid) for pid in match.groups()]
            if pids and line.startswith("dtensor    epoch 1/20 "):
                break
        assert pids, "".join(lines)
        os.kill(pids[1], signal.SIGKILL)
        killed_at = time.monotonic()
        output, _ = launcher.communicate(timeout=KILL_BOUND_S + 30)
        seconds_to_exit = time.monotonic() - killed_at
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    print(f"launcher exited {seconds_to_exit:.1f} s after the kill")
    assert launcher.returncode == 1, output[-3000:]
    assert seconds_to_exit < KILL_BOUND_S
    assert f"dtensor client 1 (pid {pids[1]}) was killed by SIGKILL; stopped the other clients" in output
    assert "epoch 20/20" not in output and output.rstrip().endswith("PARITY FAILED")
    assert not [pid for pid in pids if _alive(pid)]


@pytest.mark.extended  # a second pair of client processes for one message
def test_a_port_in_use_is_reported_in_one_line():
    with socket.socket() as taken:  # listening, without SO_REUSEPORT: gRPC cannot share it
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **client_environment("dtensor", 0, [port, free_ports(1)[0]]))
        result = subprocess.run(
            [sys.executable, os.path.join(ROOT, "compare.py"), *TWO_CLIENTS, "--trainers", "dtensor"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"compare.py: error: dtensor client 0: could not listen on 127.0.0.1:{port} (port in use?); "
        f"free it or give this client another port in DTENSOR_JOBS"
    )


@pytest.mark.parametrize(
    "environ, message",
    [
        (
            {"DTENSOR_CLIENT_ID": "0"},
            r"DTENSOR_CLIENT_ID set but not DTENSOR_NUM_CLIENTS, DTENSOR_JOB_NAME, "
            r"DTENSOR_JOBS",
        ),
        (
            {**client_environment("dtensor", 0, [1, 2, 3])},
            r"--clients 2 but DTENSOR_CLIENT_ID describes 3 clients; "
            r"use --clients 3",
        ),
        ({"TF_CONFIG": "{}"}, r"TF_CONFIG is not"),
        ({**client_environment("mirrored", 0, [1, 2]), "DTENSOR_JOBS": "x:1"}, r"both DTENSOR_\* and TF_CONFIG"),
    ],
)
def test_a_wrong_cluster_environment_is_one_line_error(environ, message):
    with pytest.raises(UsageError, match=message):
        role_from_environment(Config(clients=2), environ)


def test_the_launcher_environment_names_each_client():
    trainer, role = role_from_environment(Config(clients=2), client_environment("dtensor", 1, [5000, 5001]))
    assert (trainer, role.client_id, role.address) == ("dtensor", 1, "127.0.0.1:5001")
    trainer, role = role_from_environment(Config(clients=2), client_environment("mirrored", 1, [5000, 5001]))
    assert (trainer, role.client_id, role.num_clients) == ("mirrored", 1, 2)
    assert role_from_environment(Config(clients=2), {}) is None
    assert STARTUP_TIMEOUT_S <= KILL_BOUND_S
