"""Open MPI's mpirun (also what Kubeflow's MPIJob runs): OMPI_COMM_WORLD_* for every rank."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Optional

from ...errors import MissingDependencyError
from ..mpi_library import find_tool, launcher_family
from .base import HostCommand, Launcher, ProcessEnvironment

__all__ = ["OpenMPI", "mpirun_prefix", "OOB_KEEPALIVE", "MPI_YIELD", "apply_mpi_yield", "mpi_yield_decision"]

#: Open MPI's daemons probe their idle connections after 10 s, every 5 s, 3 times (defaults 300 s,
#: 20 s, 9): a daemon on a host cut off from mpirun then notices within 25 s, not 8 minutes.
OOB_KEEPALIVE = {"oob_tcp_keepalive_time": 10, "oob_tcp_keepalive_intvl": 5, "oob_tcp_keepalive_probes": 3}
_MPI_HINT = "install an MPI: `apt-get install openmpi-bin libopenmpi-dev` as root, or `pip install mpich`"


def mpirun_prefix(
    nproc: int, env_keys: Sequence[str] = (), hosts: Optional[str] = None, must_exist: bool = True
) -> list[str]:
    """`mpirun -np N` with the flags a run needs (root, no binding; one host: more ranks than cores).

    `hosts` ("h1:2,h2:2") places the ranks on those hosts' slots instead of oversubscribing this one.
    MPICH's mpirun (Hydra, from the `mpich` wheel or a module) binds nothing, allows root and more
    ranks than cores by itself, and passes the whole environment on: it gets `-np N` and the hosts.
    """
    tool = find_tool("mpirun")
    if not tool:
        if must_exist:
            raise MissingDependencyError(f"`mpirun` was not found on PATH; {_MPI_HINT}")
        tool = "mpirun"
    if os.path.isabs(tool) and launcher_family(tool) == "mpich":
        return [tool, "-np", str(nproc), *(["-hosts", hosts] if hosts else [])]
    cmd = [tool, "-np", str(nproc), "--bind-to", "none", *(["-H", hosts] if hosts else ["--oversubscribe"])]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for key in env_keys:
        cmd += ["-x", key]
    return cmd


class OpenMPI(Launcher):
    """Open MPI's mpirun; ``paraflow run --launcher mpirun`` starts whichever mpirun is found first."""

    name = "openmpi"
    command = "mpirun -np N python train.py"
    label = "mpirun (Open MPI)"
    rank_variable, world_size_variable = "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
    local_rank_variable, local_world_size_variable = "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"
    variable_prefixes = ("OMPI_COMM_WORLD_", "PMIX_")
    job_variables = ("PMIX_NAMESPACE",)
    stray_variables = ("OMPI_COMM_WORLD_SIZE",)
    mpi = True
    mpi_family = "openmpi"
    ends_job_on_a_failed_rank = False  # a rank's Python error must MPI_Abort, or the others wait
    tool = "mpirun"
    multihost = True

    def launch_command(self, python, nproc, script, *, port, env_keys, hosts, node_rank, must_exist) -> list[str]:
        host_list = ",".join(f"{h}:{n}" for h, n in hosts) if hosts else None
        return [*mpirun_prefix(nproc, env_keys, host_list, must_exist), python, *script]

    def host_commands(
        self, python, hosts, nproc_per_host, script, *, port, ifname, env_keys, rsh_agent, job_id
    ) -> list[HostCommand]:
        """One mpirun on the first host; Open MPI starts the others' daemons through its rsh agent."""
        extra = ["--mca", "plm_rsh_agent", rsh_agent] if rsh_agent else []
        if ifname:
            extra += ["--mca", "btl_tcp_if_include", ifname, "--mca", "oob_tcp_if_include", ifname]
        for key, value in OOB_KEEPALIVE.items():
            extra += ["--mca", key, str(value)]
        env = {"GLOO_SOCKET_IFNAME": ifname} if ifname else {}
        return [self.command_on_the_first_host(python, hosts, nproc_per_host, script, env_keys, extra, env)]


# ---------------------------------------------------------------- Open MPI's yield_when_idle
MPI_YIELD = "OMPI_MCA_mpi_yield_when_idle"


def _mpi_started() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and mpi.Is_initialized()


def mpi_yield_decision(env: ProcessEnvironment, threads: int, cores: int) -> Optional[str]:
    """Why paraflow leaves the setting alone, or None when it should set it.

    Args:
        env: this process's place in the job.
        threads: torch threads each local rank runs.
        cores: CPU cores this process may use.
    """
    if env.launched_by.mpi_family != "openmpi":
        return "not started by Open MPI's mpirun"
    if MPI_YIELD in os.environ:
        return f"{MPI_YIELD}={os.environ[MPI_YIELD]} is set already"
    if env.local_world_size * threads < cores:
        return f"{env.local_world_size} ranks x {threads} threads leave cores free"
    if _mpi_started():
        return "MPI started before paraflow.init(), too late to change it"
    return None


def apply_mpi_yield(env: ProcessEnvironment, threads: int, cores: int) -> bool:
    """Set ``OMPI_MCA_mpi_yield_when_idle=1`` when :func:`mpi_yield_decision` allows; True if set."""
    if mpi_yield_decision(env, threads, cores) is not None:
        return False
    os.environ[MPI_YIELD] = "1"
    return True
