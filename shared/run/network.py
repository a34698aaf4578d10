"""Where a one-host --clients group listens: a private network namespace with only loopback, when the system lets
an ordinary user make one.

Each client's TensorFlow server binds every interface (grpc_server_lib.cc: 0.0.0.0:port) and, as TensorFlow's
SECURITY.md says, runs whatever graph it is sent, unchecked. So the launcher starts one holder process in a new
user and network namespace (`unshare --user --net --map-root-user`; its loopback brought up, nothing else there),
and starts every client inside it (`nsenter --target HOLDER --user --net --preserve-credentials`, which execs the
client: its pid stays the one the launcher watches). The clients reach each other on 127.0.0.1 and nothing
outside reaches them. Where the namespace cannot be made (no unshare or nsenter, user namespaces off, a container
that forbids them), the clients run as before and the header says their servers listen on every interface.
Costs: the holder starts in ~50 ms; it dies with the launcher (its stdin closes), taking the namespace along.
"""

import select
import shutil
import subprocess
import sys
from typing import List, Optional

START_TIMEOUT_S = 10
UNSHARE = ["unshare", "--user", "--net", "--map-root-user", "--"]
NSENTER = ["nsenter", "--user", "--net", "--preserve-credentials", "--target"]
# The holder: loopback up (SIOCSIFFLAGS, as `ip link set lo up` does, without needing iproute2), "ready", then it
# waits for its stdin to close, which happens when the launcher ends, however it ends.
HOLDER = """
import fcntl, socket, struct, sys
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP, IFREQ = 0x8913, 0x8914, 0x1, "16sH22x"
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
    flags = struct.unpack(IFREQ, fcntl.ioctl(sock, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))[1]
    fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))
print("ready", flush=True)
sys.stdin.read()
"""


class PrivateNetwork:
    """One loopback-only network namespace for every client group of a launcher, or why there is none."""

    def __init__(self):
        self.holder: Optional[subprocess.Popen] = None
        self.why_not = ""

    def start(self) -> bool:
        """Make the namespace and check that a process can join it; False (and `why_not`) if it cannot be."""
        missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
        if missing:
            self.why_not = f"no {' or '.join(missing)} here (util-linux)"
            return False
        try:
            self.holder = subprocess.Popen(
                [*UNSHARE, sys.executable, "-c", HOLDER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            answered, _, _ = select.select([self.holder.stdout], [], [], START_TIMEOUT_S)
            ready = bool(answered) and self.holder.stdout.readline().strip() == "ready"
            joined = (
                ready
                and subprocess.run(self.command(["true"]), capture_output=True, timeout=START_TIMEOUT_S).returncode == 0
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            ready = joined = False
            self.why_not = str(error)
        if not joined:
            self.why_not = self.why_not or self._holder_error() or "joining it failed"
            self.stop()
            return False
        return True

    def _holder_error(self) -> str:
        """The holder's last error line (unshare's own: "unshare failed: Operation not permitted")."""
        if self.holder is None:
            return ""
        self.holder.kill()
        lines = [line.strip() for line in self.holder.stderr.read().splitlines() if line.strip()]
        return lines[-1][:200] if lines else ""

    def command(self, command: List[str]) -> List[str]:
        """`command` run inside the namespace (as is without one)."""
        return [*NSENTER, str(self.holder.pid), "--", *command] if self.holder else list(command)

    def describe(self) -> str:
        """The header's line: where the clients' servers can be reached from, and for how long."""
        if self.holder:
            return (
                "network: the clients share a private network namespace with loopback only (unshare --user --net); "
                "their TensorFlow servers cannot be reached from other machines"
            )
        return (
            f"network: no private network namespace here ({self.why_not}); the clients' TensorFlow servers listen "
            f"on every interface, unauthenticated, while each trainer's clients train: run this on an isolated "
            f"network (docs/multi-machine.md)"
        )

    def stop(self) -> None:
        if self.holder is not None and self.holder.poll() is None:
            self.holder.stdin.close()
            self.holder.kill()
        if self.holder is not None:
            self.holder.wait()
            for stream in (self.holder.stdout, self.holder.stderr):
                stream.close()
        self.holder = None
