"""Open MPI's ``mpi_yield_when_idle`` under mpirun, when the ranks fill every core.

Open MPI busy-polls while a rank waits for a message, and yields the core only when it knows
the node is oversubscribed (more ranks than slots). When the ranks' threads fill every core
(the default here: cores // local ranks threads each) and a library adds threads of its own
(horovod's background thread), that polling starves them: on a 2-core machine horovod under
mpirun ran 3-4 times slower (README, "Porting a script"). Open MPI reads its MCA variables
from the environment in ``MPI_Init``, so setting ``OMPI_MCA_mpi_yield_when_idle=1`` in this
process before MPI starts (mpi4py's import, ``hvd.init()``) has the effect of ``mpirun -x``.
A value the user set (``mpirun --mca mpi_yield_when_idle 0`` arrives the same way) is kept.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from .launchers import ProcessEnvironment

__all__ = ["MPI_YIELD", "apply_mpi_yield", "mpi_yield_decision"]

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
    if env.launcher != "openmpi":
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
