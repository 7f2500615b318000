"""Where is rank 0? Resolve MASTER_ADDR / MASTER_PORT for launchers that do not set them."""

from __future__ import annotations

import socket

from ..errors import LauncherError, MissingDependencyError
from .launchers import ProcessEnvironment, free_port

__all__ = ["resolve_master"]


def _rank0_endpoint(env: ProcessEnvironment) -> tuple[str, int]:
    single_host = env.local_world_size == env.world_size
    host = "127.0.0.1" if single_host else socket.gethostname()
    return host, free_port()


def resolve_master(env: ProcessEnvironment) -> tuple[str, int]:
    """Return rank 0's address and a port every rank agrees on.

    Uses MASTER_ADDR / MASTER_PORT when the launcher set them; a free local port for one
    process; under MPI, rank 0's host and a free port broadcast with mpi4py.

    Raises:
        MissingDependencyError: MPI launched the job, mpi4py is missing and no MASTER_* is set.
        LauncherError: the launcher gives no way to agree on rank 0's address.
    """
    if env.master_addr and env.master_port:
        return env.master_addr, env.master_port
    if env.world_size == 1:
        return _rank0_endpoint(env)
    if env.is_mpi:
        try:
            from mpi4py import MPI
        except ImportError:
            raise MissingDependencyError(
                f"{env.launcher} started {env.world_size} processes but set no MASTER_ADDR/MASTER_PORT, "
                "and mpi4py (used to share rank 0's address) is not installed. Install it with "
                "`pip install mpi4py` (needs an MPI: `apt-get install libopenmpi-dev`), or pass the "
                "address yourself: `mpirun -np N -x MASTER_ADDR=<rank-0 host> -x MASTER_PORT=29500 "
                "python train.py`."
            ) from None
        endpoint = _rank0_endpoint(env) if env.rank == 0 else None
        return MPI.COMM_WORLD.bcast(endpoint, root=0)
    raise LauncherError(
        f"{env.launcher} started {env.world_size} processes but set no MASTER_ADDR/MASTER_PORT. "
        "Set both to rank 0's host and a free port, or launch with "
        "`torchrun --nproc_per_node N train.py`."
    )
