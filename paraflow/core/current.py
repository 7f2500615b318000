"""The backend this process initialised, for code that cannot be handed the object.

``hvd.rank()`` and ``dist.get_rank()`` answer from anywhere in a script; ``paraflow.current()``
is their counterpart for every backend, so a dataset, a logger or a metric deep in the code
does not need the backend threaded through every call.
"""

from __future__ import annotations

from typing import Any

from ..errors import NotInitializedError

__all__ = ["current", "rank", "world_size", "local_rank", "is_main", "set_current", "clear_current"]

# Initialised backends of this process, most recent last (a backend may be started inside another's session).
_ACTIVE: list = []


def set_current(backend: Any) -> None:
    """Record `backend` as this process's current backend (called by ``Backend.init``)."""
    clear_current(backend)
    _ACTIVE.append(backend)


def clear_current(backend: Any) -> None:
    """Forget `backend` (called by ``Backend.shutdown``); the one initialised before it is current again."""
    _ACTIVE[:] = [b for b in _ACTIVE if b is not backend]


def current() -> Any:
    """The backend this process initialised most recently and has not shut down.

    Raises:
        NotInitializedError: no backend is initialised in this process.
    """
    if not _ACTIVE:
        raise NotInitializedError(
            "no paraflow backend is initialised in this process: call `backend = paraflow.init(...)` "
            "(or enter `with paraflow.init(...) as backend:`) before paraflow.current(), paraflow.rank() "
            "or paraflow.world_size()."
        )
    return _ACTIVE[-1]


def rank() -> int:
    """Global rank of this process in the current backend's job."""
    return current().rank


def world_size() -> int:
    """Number of processes in the current backend's job."""
    return current().world_size


def local_rank() -> int:
    """Rank of this process on its host."""
    return current().local_rank


def is_main() -> bool:
    """True on global rank 0."""
    return current().rank == 0
