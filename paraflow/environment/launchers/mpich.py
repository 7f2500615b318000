"""MPICH's Hydra (mpiexec, mpirun) and Intel MPI: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS."""

from __future__ import annotations

from .base import Launcher

__all__ = ["MPICH"]


class MPICH(Launcher):
    name = "mpich"
    command = "mpiexec -n N python train.py"
    label = "mpiexec (MPICH)"
    rank_variable, world_size_variable = "PMI_RANK", "PMI_SIZE"
    local_rank_variable, local_world_size_variable = "MPI_LOCALRANKID", "MPI_LOCALNRANKS"
    variable_prefixes = ("PMI_", "MPI_LOCAL")
    job_variables = ("PMI_KVSNAME",)
    stray_variables = ("PMI_SIZE",)
    mpi = True
    mpi_family = "mpich"
    ends_job_on_a_failed_rank = False
