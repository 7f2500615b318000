"""An emulated multi-host cluster on one Linux machine (root): namespaces, a switch, shaped links.

See :mod:`paraflow.tools.cluster.cluster` for what is built and how jobs run on it.
"""

from .cluster import (
    IFNAME,
    SUBNET,
    Cluster,
    ClusterJob,
    Host,
    cluster_commands,
    cluster_names,
    exec_argv,
    owned_name,
    remove_stale,
)
from .netns import ClusterError, support_problem

__all__ = [
    "Cluster",
    "ClusterError",
    "ClusterJob",
    "Host",
    "IFNAME",
    "SUBNET",
    "cluster_commands",
    "cluster_names",
    "exec_argv",
    "owned_name",
    "remove_stale",
    "support_problem",
]
