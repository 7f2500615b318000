"""SLURM's srun: one task per process; rank 0's host is the step's first node."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Optional

from ...errors import ConfigurationError, MissingDependencyError
from ..mpi_library import find_tool
from .base import Identity, Launcher

__all__ = ["Slurm", "expand_hostlist", "SRUN_HINT"]

SRUN_HINT = "srun comes with SLURM: run inside an allocation (`salloc -n N`) on a SLURM cluster"


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a SLURM host list such as ``node[01-03,07],gpu1`` into host names."""
    hosts: list[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", hostlist):
        prefix, ranges = match.group(1), match.group(2)
        if not ranges:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                hosts.extend(f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1))
            else:
                hosts.append(prefix + part)
    return hosts


class Slurm(Launcher):
    """``srun``: SLURM_PROCID, SLURM_NTASKS (the step's SLURM_STEP_NUM_TASKS first), SLURM_LOCALID."""

    name = "slurm"
    command = "srun -n N python train.py"
    label = "srun"
    rank_variable, world_size_variable, local_rank_variable = "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"
    variable_prefixes = ("SLURM_", "PMI_", "PMIX_")
    job_variables = ("SLURM_JOB_ID", "SLURM_STEP_ID")
    mpi_when_asked = True  # srun --mpi=pmix starts MPI ranks too
    tool = "srun"

    def identity(self, env: Mapping[str, str]) -> Identity:
        world_key = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
        world = self.integer(env, world_key)
        return Identity(self.integer(env, "SLURM_PROCID"), world, self.integer(env, "SLURM_LOCALID"), _local_size(env))

    def master(self, env: Mapping[str, str]) -> tuple[Optional[str], Optional[int]]:
        """MASTER_ADDR/MASTER_PORT when set, else the step's first node and a port from the job id."""
        addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
        if not addr:
            nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
            addr = expand_hostlist(nodes)[0] if nodes else None
            if not port and env.get("SLURM_JOB_ID"):
                port = str(15000 + int(env["SLURM_JOB_ID"]) % 20000)
        return addr, self._port(port)

    def inside_an_allocation(self, env: Mapping[str, str]) -> bool:
        return bool(env.get("SLURM_JOB_ID"))

    def launch_command(self, python, nproc, script, *, port, env_keys, hosts, node_rank, must_exist) -> list[str]:
        """``srun -n N``; a rank that fails ends the step, as the other launchers do."""
        where = []
        if hosts:
            if len({n for _, n in hosts}) != 1:
                raise ConfigurationError(
                    "srun starts the same number of tasks on every node: give every host the same count "
                    "(--hosts h1:2,h2:2)."
                )
            where = ["--nodelist", ",".join(h for h, _ in hosts), "--ntasks-per-node", str(hosts[0][1])]
        tool = find_tool("srun")
        if not tool:
            if must_exist:
                raise MissingDependencyError(f"`srun` was not found on PATH; {SRUN_HINT}")
            tool = "srun"
        return [tool, "-n", str(nproc), *where, "--kill-on-bad-exit=1", python, *script]


def _local_size(env: Mapping[str, str]) -> int:
    """Tasks on this node, from SLURM's compressed per-node counts such as ``4(x2),3``."""
    if env.get("SLURM_NTASKS_PER_NODE"):
        return int(env["SLURM_NTASKS_PER_NODE"])
    counts: list[int] = []
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    for item in filter(None, spec.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if m:
            counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    node = int(env.get("SLURM_NODEID", "0"))
    return counts[node] if node < len(counts) else 1
