"""An emulated multi-host cluster on one Linux machine (root): namespaces, a switch, shaped links.

See :mod:`paraflow.tools.cluster.cluster` for what is built and :mod:`.jobs` for running on it.
"""

from .cluster import IFNAME, SUBNET, Cluster, Host, cluster_names, owned_name, remove_stale
from .jobs import ClusterJob, cluster_commands, exec_argv
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
