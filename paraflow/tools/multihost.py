"""Command lines that start one job across several hosts, for each launcher, as its documentation says.

* torchrun: one agent per host, all meeting at a c10d rendezvous on the first host;
* mpirun: one command on the first host; Open MPI starts the other hosts' daemons through its rsh
  agent (ssh by default);
* horovodrun: one command on the first host; horovodrun reaches the others with `ssh`.

mpirun's and horovodrun's lines are :func:`~paraflow.tools.launch.launch_command`'s for those hosts,
with what crossing hosts needs added: the interface the ranks talk over, the program that reaches
another host, and Open MPI's keepalive probes. (``paraflow run --hosts`` starts torchrun with its
static rendezvous and a node rank per host instead.) Nothing here knows how a host is reached: a
real cluster runs each :class:`HostCommand` over ssh, the emulated one
(:mod:`paraflow.tools.cluster`) inside the host's namespace.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from ..environment.launchers import launcher_tools
from ..errors import ConfigurationError
from .launch import launch_command

__all__ = ["HostCommand", "host_commands", "MULTIHOST_LAUNCHERS", "OOB_KEEPALIVE"]

MULTIHOST_LAUNCHERS = launcher_tools(multihost=True)
#: Open MPI's daemons probe their idle connections after 10 s, every 5 s, 3 times (defaults 300 s,
#: 20 s, 9): a daemon on a host cut off from mpirun then notices within 25 s, not 8 minutes.
OOB_KEEPALIVE = {"oob_tcp_keepalive_time": 10, "oob_tcp_keepalive_intvl": 5, "oob_tcp_keepalive_probes": 3}


@dataclass(frozen=True)
class HostCommand:
    """What to run on one host: the command and the variables to set there first."""

    host: str
    argv: list
    env: dict = field(default_factory=dict)


def host_commands(
    launcher: str,
    hosts: Sequence[str],
    nproc_per_host: int,
    script: Sequence[str],
    *,
    port: int = 29400,
    ifname: Optional[str] = None,
    env_keys: Sequence[str] = (),
    rsh_agent: Optional[str] = None,
    job_id: Optional[str] = None,
) -> list[HostCommand]:
    """The per-host commands that start `script` as ``len(hosts) * nproc_per_host`` processes.

    Args:
        launcher: torchrun, mpirun or horovodrun.
        hosts: host names (or addresses) the launchers can resolve; the first hosts the rendezvous.
        nproc_per_host: processes on each host.
        script: the Python file and its arguments.
        port: torchrun's rendezvous port on the first host.
        ifname: the network interface ranks talk over (eth0): GLOO_SOCKET_IFNAME, Open MPI's
            btl/oob_tcp_if_include, horovodrun's --network-interface. None lets each library choose.
        env_keys: variables of the launching environment every rank needs (mpirun forwards them
            with -x; horovodrun forwards the whole environment; torchrun runs where they are set).
        rsh_agent: the program that runs a command on another host in place of ssh (mpirun's
            plm_rsh_agent; for horovodrun its directory goes first on PATH, so it must be named ssh).
        job_id: torchrun's rendezvous id (default: a fresh one).
    """
    if launcher not in MULTIHOST_LAUNCHERS:
        raise ConfigurationError(f"unknown launcher {launcher!r}; across hosts: {', '.join(MULTIHOST_LAUNCHERS)}.")
    if not hosts or nproc_per_host < 1:
        raise ConfigurationError(
            f"need at least one host and one process per host (got {list(hosts)}, {nproc_per_host})."
        )
    python, script = sys.executable, [str(s) for s in script]
    env = {"GLOO_SOCKET_IFNAME": ifname} if ifname else {}
    placement = [(host, nproc_per_host) for host in hosts]
    total = len(hosts) * nproc_per_host
    if launcher == "torchrun":
        # c10d, the rendezvous torch documents for several nodes: no --node_rank to hand out.
        argv = [python, "-m", "torch.distributed.run", "--nnodes", str(len(hosts))]
        argv += ["--nproc_per_node", str(nproc_per_host), "--rdzv-backend", "c10d"]
        argv += ["--rdzv-endpoint", f"{hosts[0]}:{port}", "--rdzv-id", job_id or uuid.uuid4().hex[:12]]
        return [HostCommand(host, [*argv, *script], dict(env)) for host in hosts]
    base = launch_command(launcher, total, script, env_keys=[*env, *env_keys], hosts=placement)
    extra: list[str] = []  # goes before the Python command
    if launcher == "mpirun":
        if rsh_agent:
            extra += ["--mca", "plm_rsh_agent", rsh_agent]
        if ifname:
            extra += ["--mca", "btl_tcp_if_include", ifname, "--mca", "oob_tcp_if_include", ifname]
        for key, value in OOB_KEEPALIVE.items():
            extra += ["--mca", key, str(value)]
    else:
        extra += ["--disable-cache"] + (["--network-interface", ifname] if ifname else [])
        if rsh_agent:
            env["PATH"] = os.path.dirname(rsh_agent) + os.pathsep + os.environ.get("PATH", "")
    at = base.index(python)
    return [HostCommand(hosts[0], [*base[:at], *extra, *base[at:]], env)]
