"""--clients with DTensor: each process one client of a multi-client mesh, told its place by DTENSOR_* variables
(docs/multi-machine.md)."""

from typing import Dict, Mapping, Optional, Sequence

from tensorflow.experimental import dtensor

from dtensor_vs_mirrored.dtensor_impl import combining, nccl
from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.training.protocol import Cluster, ClusterRole

VARIABLES = ("DTENSOR_CLIENT_ID", "DTENSOR_NUM_CLIENTS", "DTENSOR_JOB_NAME", "DTENSOR_JOBS")
JOB_NAME = "worker"


def role(config: Config, environ: Mapping[str, str]) -> Optional[ClusterRole]:
    """This client's place from DTENSOR_*; None when none is set."""
    found = [name for name in VARIABLES if name in environ]
    if not found:
        return None
    missing = [name for name in VARIABLES if name not in environ]
    if missing:
        raise UsageError(
            f"{', '.join(found)} set but not {', '.join(missing)}; a DTensor client needs all of {', '.join(VARIABLES)}"
        )
    client_id = int(environ["DTENSOR_CLIENT_ID"])
    jobs = environ["DTENSOR_JOBS"].split(",")
    address = jobs[client_id] if 0 <= client_id < len(jobs) else ""
    return ClusterRole(client_id, int(environ["DTENSOR_NUM_CLIENTS"]), "DTENSOR_CLIENT_ID", address, "DTENSOR_JOBS")


def environment(client_id: int, addresses: Sequence[str]) -> Dict[str, str]:
    return {
        "DTENSOR_CLIENT_ID": str(client_id),
        "DTENSOR_NUM_CLIENTS": str(len(addresses)),
        "DTENSOR_JOB_NAME": JOB_NAME,
        "DTENSOR_JOBS": ",".join(addresses),
    }


def join(config: Config) -> None:
    """Start this client's part of DTensor's runtime (it reads DTENSOR_*), before anything else starts it. In
    multi-client mode its shutdown_accelerator_system() raises, so it is never called."""
    combining.settle(config.device_type)  # before DTensor starts: dtensor_impl/combining.py
    nccl.settle(config.device_type, config.devices, config.dtensor_nccl)  # DTENSOR_GPU_USE_NCCL_COMMUNICATION
    dtensor.initialize_accelerator_system(config.device_type)


CLUSTER = Cluster(VARIABLES, role, environment, join)
