"""Where is rank 0? Resolve MASTER_ADDR / MASTER_PORT for launchers that do not set them."""

from __future__ import annotations

import os
import socket
import struct
from typing import Callable

from ..errors import LauncherError, MissingDependencyError
from .launchers import ProcessEnvironment, free_port

__all__ = ["resolve_master", "host_address", "interface_address", "gloo_ifname"]

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def interface_address(name: str) -> str:
    """The IPv4 address of network interface `name` on this host.

    Raises:
        LauncherError: no such interface, or it has no IPv4 address.
    """
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as exc:
            raise LauncherError(
                f"GLOO_SOCKET_IFNAME names interface {name!r}, which has no IPv4 address on host "
                f"{socket.gethostname()} ({exc.strerror}). `ip -br addr` lists the interfaces; set "
                f"GLOO_SOCKET_IFNAME to the one the hosts reach each other over."
            ) from None
    return socket.inet_ntoa(packed[20:24])


def gloo_ifname() -> str:
    """The first interface GLOO_SOCKET_IFNAME names (gloo takes a list), or ''."""
    return next((n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n), "")


def host_address(fallback: Callable[[], str] = socket.gethostname) -> str:
    """How other hosts reach this one: the address of GLOO_SOCKET_IFNAME's (first) interface when it
    is set, the interface gloo itself will use, so no host name has to resolve; else `fallback()`
    (the host name), resolved by each peer."""
    name = gloo_ifname()
    return interface_address(name) if name else fallback()


def _rank0_endpoint(env: ProcessEnvironment) -> tuple[str, int]:
    single_host = env.local_world_size == env.world_size
    host = "127.0.0.1" if single_host else host_address()
    return host, free_port()


def resolve_master(env: ProcessEnvironment) -> tuple[str, int]:
    """Return rank 0's address and a port every rank agrees on.

    Uses MASTER_ADDR / MASTER_PORT when the launcher set them (torchrun always does); a free
    local port for one process; under MPI, rank 0's host and a free port broadcast with mpi4py.

    Raises:
        MissingDependencyError: MPI launched the job, mpi4py is missing and no MASTER_* is set.
        LauncherError: the launcher gives no way to agree on rank 0's address, or torchrun's
            variables lack MASTER_ADDR or MASTER_PORT (saying which).
    """
    if env.master_addr and env.master_port:
        return env.master_addr, env.master_port
    if env.launched_by.sets_master:  # name what is missing, not torch's ValueError
        missing = [
            name for name, value in (("MASTER_ADDR", env.master_addr), ("MASTER_PORT", env.master_port)) if not value
        ]
        raise LauncherError(
            f"RANK and WORLD_SIZE are set (torch's env:// variables), but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not, so rank {env.rank} cannot find rank 0. Launch with "
            f"`torchrun --nproc_per_node {env.world_size} train.py`, which sets them, or set them yourself "
            f"(on one host: MASTER_ADDR=127.0.0.1 MASTER_PORT=29500)."
        )
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
