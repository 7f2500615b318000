"""Where the stall reports meet: a key-value store every rank reaches without a collective.

- torch.distributed backends: the process group's own rendezvous store (torchrun's agent store,
  or the one rank 0 serves for ``tcp://``), through a connection of the watchdog's own
  (``Store.clone``), so it never queues behind the main thread.
- other backends (horovod under mpirun or horovodrun has no torch store): rank 0 serves a small
  torch ``TCPStore`` on a free port and the address reaches the other ranks once, at ``init``,
  through the backend's own broadcast.

Each returns an *opener*, called in the watchdog's thread on its first wake, so connecting costs
the main thread nothing.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any, Callable, Optional

__all__ = ["process_group_store", "hosted_store", "STORE_OP_TIMEOUT_S"]

#: Seconds one store operation of the watchdog may block (rank 0 gone: give up, try later).
_ADDRESS_BYTES = 256  # a host name and a port
STORE_OP_TIMEOUT_S = 10.0
_sessions = 0  # backends started in this process: keys of an earlier session never mix in


def _prefix() -> str:
    global _sessions
    _sessions += 1
    return f"paraflow/stall/{_sessions}/"


def process_group_store() -> Optional[Callable[[], Any]]:
    """An opener for a clone of torch.distributed's default store, or None without one."""
    import torch.distributed as dist

    base = dist.distributed_c10d._get_default_store() if dist.is_initialized() else None
    if base is None or not hasattr(base, "clone"):
        return None
    prefix = _prefix()

    def open_store() -> Any:
        store = base.clone()
        store.set_timeout(datetime.timedelta(seconds=STORE_OP_TIMEOUT_S))
        return dist.PrefixStore(prefix, store)

    return open_store


def hosted_store(backend: Any) -> Optional[Callable[[], Any]]:
    """Rank 0 serves a TCPStore; its address reaches every rank through one broadcast (a collective call).

    Returns None on every rank when rank 0 could not open one.
    """
    import torch.distributed as dist

    prefix = _prefix()
    server, address = None, None
    timeout = datetime.timedelta(seconds=STORE_OP_TIMEOUT_S)
    if backend.rank == 0:
        host = "127.0.0.1" if backend.local_world_size == backend.world_size else socket.gethostname()
        try:
            server = dist.TCPStore(host, 0, backend.world_size, True, timeout=timeout, wait_for_workers=False)
            address = (host, server.port)
        except Exception:  # noqa: BLE001 - no store, no stall reports; training goes on
            address = None
    address = _broadcast_address(backend, address)
    if address is None:
        return None

    def open_store() -> Any:
        store = server or dist.TCPStore(
            address[0], address[1], backend.world_size, False, timeout=timeout, wait_for_workers=False
        )
        return dist.PrefixStore(prefix, store)

    return open_store


def _broadcast_address(backend: Any, address: Optional[tuple]) -> Optional[tuple]:
    """Rank 0's (host, port), or None, on every rank: one broadcast of a fixed-size byte tensor."""
    import torch

    raw = torch.zeros(_ADDRESS_BYTES, dtype=torch.uint8)
    if address is not None:
        text = f"{address[0]}:{address[1]}".encode()
        raw[: len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    text = bytes(backend.broadcast(raw, src=0).tolist()).rstrip(b"\0").decode()
    if not text:
        return None
    host, _, port = text.rpartition(":")
    return host, int(port)
