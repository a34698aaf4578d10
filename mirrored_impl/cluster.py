"""--clients with MirroredStrategy: MultiWorkerMirroredStrategy over the workers that TF_CONFIG names, one
process each (docs/multi-machine.md)."""

import functools
import json
from typing import Dict, Mapping, Optional, Sequence

import tensorflow as tf

from dtensor_vs_mirrored.shared.config import Config
from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.training.protocol import Cluster, ClusterRole

COLLECTIVE_TIMEOUT_S = 60  # longest wait for a peer in one collective (first step: tracing skew)


@functools.lru_cache(maxsize=1)
def multi_worker_strategy():
    """The strategy over the workers that TF_CONFIG names, one replica per worker on CPU; the first call joins
    the cluster, before anything initialises TensorFlow's runtime in this process (`join`), and the trainer gets
    the same strategy. A peer that dies is caught by the coordination service's heartbeat; COLLECTIVE_TIMEOUT_S
    bounds a collective that waits for a peer that is alive but stuck."""
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING, timeout_seconds=COLLECTIVE_TIMEOUT_S
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def role(config: Config, environ: Mapping[str, str]) -> Optional[ClusterRole]:
    """This worker's place from TF_CONFIG; None when it is not set."""
    if "TF_CONFIG" not in environ:
        return None
    try:
        tf_config = json.loads(environ["TF_CONFIG"])
        workers, index = tf_config["cluster"]["worker"], int(tf_config["task"]["index"])
    except (ValueError, KeyError, TypeError):
        raise UsageError(
            'TF_CONFIG is not {"cluster": {"worker": [...]}, "task": {"type": "worker", '
            '"index": I}}; fix it or unset it'
        ) from None
    return ClusterRole(
        index, len(workers), "TF_CONFIG", workers[index] if 0 <= index < len(workers) else "", "TF_CONFIG"
    )


def environment(client_id: int, addresses: Sequence[str]) -> Dict[str, str]:
    return {
        "TF_CONFIG": json.dumps(
            {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": client_id}}
        )
    }


def join(config: Config) -> None:
    """Join the workers that TF_CONFIG names, before anything else starts TensorFlow's runtime."""
    multi_worker_strategy()


CLUSTER = Cluster(("TF_CONFIG",), role, environment, join)
