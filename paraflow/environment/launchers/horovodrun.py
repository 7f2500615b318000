"""horovodrun with its gloo controller: HOROVOD_* for every rank, and horovod's own rendezvous."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Optional

from ...errors import MissingDependencyError
from ..mpi_library import find_tool
from .base import HostCommand, Launcher

__all__ = ["Horovodrun", "HOROVODRUN_HINT"]

HOROVODRUN_HINT = "install horovod: `make install` or scripts/build_horovod.sh"


class Horovodrun(Launcher):
    name = "horovodrun"
    command = "horovodrun -np N --gloo python train.py"
    rank_variable, world_size_variable = "HOROVOD_RANK", "HOROVOD_SIZE"
    local_rank_variable, local_world_size_variable = "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"
    variable_prefixes = ("HOROVOD_",)
    job_variables = ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT")
    stray_variables = ("HOROVOD_SIZE",)
    runs_horovod_rendezvous = True
    ends_job_on_a_failed_rank = False  # its gloo ranks wait on a lost peer: paraflow ends the job
    tool = "horovodrun"
    multihost = True
    recovery = "rollback"
    elastic_command = (
        "horovodrun -np N --min-np MIN --max-np MAX --host-discovery-script S "
        "python train.py --backend horovod --elastic"
    )

    def launched_elastic(self, env: Mapping[str, str]) -> bool:
        """Started with ``--min-np``/``--max-np`` or a host-discovery script (horovod's elastic mode)."""
        return env.get("HOROVOD_ELASTIC") == "1"

    def master(self, env: Mapping[str, str]) -> tuple[Optional[str], Optional[int]]:
        """MASTER_ADDR/MASTER_PORT when set, else the host of horovod's rendezvous server."""
        addr, port = super().master(env)
        return addr or env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR") or None, port

    def launch_command(self, python, nproc, script, *, port, env_keys, hosts, node_rank, must_exist) -> list[str]:
        host_list = ",".join(f"{h}:{n}" for h, n in hosts) if hosts else f"localhost:{nproc}"
        tool = find_tool("horovodrun")
        if not tool:
            if must_exist:
                raise MissingDependencyError(f"`horovodrun` was not found on PATH; {HOROVODRUN_HINT}")
            tool = "horovodrun"
        return [tool, "-np", str(nproc), "-H", host_list, "--gloo", python, *script]

    def elastic_launch_command(
        self, python, nproc, min_np, max_np, script, *, port, discovery, max_restarts, must_exist
    ) -> list[str]:
        """horovodrun's elastic mode: `nproc` workers, at least `min_np` and at most `max_np`, on the
        hosts `discovery` prints (gloo controller)."""
        tool = find_tool("horovodrun")
        if not tool:
            if must_exist:
                raise MissingDependencyError(f"`horovodrun` was not found on PATH; {HOROVODRUN_HINT}")
            tool = "horovodrun"
        sizes = ["-np", str(nproc), "--min-np", str(min_np), "--max-np", str(max_np)]
        return [tool, *sizes, "--host-discovery-script", discovery, python, *script]

    def discovery_script(self, max_np: int) -> Optional[str]:
        """This host under several names (localhost, 127.0.0.1, its own name), the slots dealt out among
        them: horovod blacklists the host of a worker that failed, and a single name would take the
        survivors' slots with it (the driver then ends the job)."""
        names = ["localhost", "127.0.0.1", socket.gethostname()]
        slots = [max_np // len(names) + (1 if i < max_np % len(names) else 0) for i in range(len(names))]
        lines = "".join(f"echo {name}:{n}\n" for name, n in zip(names, slots) if n)
        return f"#!/bin/sh\n{lines}"

    def host_commands(
        self, python, hosts, nproc_per_host, script, *, port, ifname, env_keys, rsh_agent, job_id
    ) -> list[HostCommand]:
        """One horovodrun on the first host; it reaches the others with `ssh` (`rsh_agent`, named ssh)."""
        env = {"GLOO_SOCKET_IFNAME": ifname} if ifname else {}
        extra = ["--disable-cache"] + (["--network-interface", ifname] if ifname else [])
        if rsh_agent:
            env["PATH"] = os.path.dirname(rsh_agent) + os.pathsep + os.environ.get("PATH", "")
        return [self.command_on_the_first_host(python, hosts, nproc_per_host, script, env_keys, extra, env)]
