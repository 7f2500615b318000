"""LSF's jsrun (IBM Spectrum LSF, Summit-class machines): JSM_NAMESPACE_* for every rank.

Rank 0's host is the first compute host of ``LSB_DJOB_RANKFILE`` (its first line is the launch
node, which runs no rank), unless MASTER_ADDR is set; the port is MASTER_PORT, else one derived
from the job id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from .base import Launcher

__all__ = ["LSF"]


class LSF(Launcher):
    name = "lsf"
    command = "jsrun -n N python train.py"
    label = "jsrun (LSF)"
    rank_variable, world_size_variable = "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE"
    local_rank_variable, local_world_size_variable = "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_LOCAL_SIZE"
    variable_prefixes = ("JSM_NAMESPACE_",)
    other_variables = ("LSB_DJOB_RANKFILE",)
    job_variables = ("LSB_JOBID",)
    mpi = True  # jsrun starts Spectrum MPI's ranks
    ends_job_on_a_failed_rank = False

    def master(self, env: Mapping[str, str]) -> tuple[Optional[str], Optional[int]]:
        addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
        if not addr and env.get("LSB_DJOB_RANKFILE"):
            try:
                with open(env["LSB_DJOB_RANKFILE"]) as f:
                    hosts = [line.strip() for line in f if line.strip()]
            except OSError:
                hosts = []
            addr = hosts[1] if len(hosts) > 1 else (hosts[0] if hosts else None)
        if not port and env.get("LSB_JOBID", "").isdigit():
            port = str(10000 + int(env["LSB_JOBID"]) % 20000)
        return addr or None, self._port(port)
