"""MVAPICH2's launchers: MV2_COMM_WORLD_*."""

from __future__ import annotations

from .base import Launcher

__all__ = ["MVAPICH2"]


class MVAPICH2(Launcher):
    name = "mvapich2"
    command = "mpirun_rsh -np N python train.py"
    label = "mpirun (MVAPICH2)"
    rank_variable, world_size_variable = "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"
    local_rank_variable, local_world_size_variable = "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"
    variable_prefixes = ("MV2_COMM_WORLD_",)
    mpi = True
    ends_job_on_a_failed_rank = False
