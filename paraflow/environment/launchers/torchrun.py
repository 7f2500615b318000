"""torchrun (and ``python -m torch.distributed.launch``): torch's elastic agent on each host."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Optional

from .base import HostCommand, Launcher, free_port

__all__ = ["Torchrun"]


class Torchrun(Launcher):
    """The agent sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT,
    and serves torch's TCPStore at MASTER_PORT."""

    name = "torchrun"
    command = "torchrun --nproc_per_node N train.py"
    rank_variable, world_size_variable = "RANK", "WORLD_SIZE"
    local_rank_variable, local_world_size_variable = "LOCAL_RANK", "LOCAL_WORLD_SIZE"
    other_variables = ("GROUP_RANK", "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
    job_variables = ("TORCHELASTIC_RUN_ID", "MASTER_PORT")
    stray_variables = ("WORLD_SIZE", "LOCAL_RANK")
    sets_master = True
    serves_store = True
    tool = "torchrun"
    multihost = True
    comes_with_torch = True
    agent_per_host = True
    recovery = "restart"
    #: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with torch's default (the rendezvous store shared with the
    #: workers) an agent that joins a running job waits for a store address its peers never publish
    #: again, and the round fails after the store's 60 s timeout, ending the job.
    elastic_command = (
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes MIN:MAX --nproc_per_node N --max-restarts K "
        "--rdzv-backend c10d --rdzv-endpoint HOST:PORT train.py --elastic"
    )

    def launched_elastic(self, env: Mapping[str, str]) -> bool:
        """Its agent restarts the workers: ``--max-restarts`` above 0."""
        try:
            return int(env.get("TORCHELASTIC_MAX_RESTARTS") or 0) > 0
        except ValueError:
            return False

    def detect(self, env: Mapping[str, str]) -> bool:
        """RANK with marks of torchrun's own: LOCAL_WORLD_SIZE, or the agent's TORCHELASTIC_RUN_ID
        (RANK and WORLD_SIZE alone are torch's plain env:// contract)."""
        return "RANK" in env and ("LOCAL_WORLD_SIZE" in env or "TORCHELASTIC_RUN_ID" in env)

    def launch_command(self, python, nproc, script, *, port, env_keys, hosts, node_rank, must_exist) -> list[str]:
        """One agent on this host (a free port), or the agent of host `node_rank` (static rendezvous)."""
        run = [python, "-m", "torch.distributed.run"]
        if not hosts:
            where = ["--nnodes", "1", "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1"]
            return [*run, *where, "--master_port", str(port or free_port()), *script]
        endpoint = f"{hosts[0][0]}:{port or 29500}"
        where = [
            "--nnodes",
            str(len(hosts)),
            "--node_rank",
            str(node_rank),
            "--nproc_per_node",
            str(hosts[node_rank][1]),
        ]
        return [*run, *where, "--rdzv_backend", "static", "--rdzv_endpoint", endpoint, *script]

    def elastic_launch_command(
        self, python, nproc, min_np, max_np, script, *, port, discovery, max_restarts, must_exist
    ) -> list[str]:
        """One agent that restarts its `nproc` workers up to `max_restarts` times, at a c10d rendezvous
        (its MIN:MAX counts agents, i.e. hosts: on one host the number of processes stays `nproc`)."""
        where = ["--nnodes", "1:1", "--nproc_per_node", str(nproc), "--max-restarts", str(max_restarts)]
        endpoint = f"127.0.0.1:{port or free_port('127.0.0.1')}"
        rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", uuid.uuid4().hex[:12]]
        return [python, "-m", "torch.distributed.run", *where, *rendezvous, *script]

    def host_commands(
        self,
        python: str,
        hosts: Sequence[str],
        nproc_per_host: int,
        script: Sequence[str],
        *,
        port: int,
        ifname: Optional[str],
        env_keys: Sequence[str],
        rsh_agent: Optional[str],
        job_id: Optional[str],
    ) -> list[HostCommand]:
        """One agent per host, all meeting at a c10d rendezvous (torch's way for several nodes) on the first."""
        env = {"GLOO_SOCKET_IFNAME": ifname} if ifname else {}
        argv = [python, "-m", "torch.distributed.run", "--nnodes", str(len(hosts))]
        argv += ["--nproc_per_node", str(nproc_per_host), "--rdzv-backend", "c10d"]
        argv += ["--rdzv-endpoint", f"{hosts[0]}:{port}", "--rdzv-id", job_id or uuid.uuid4().hex[:12]]
        return [HostCommand(host, [*argv, *script], dict(env)) for host in hosts]
