"""Turn communication failures from torch and horovod into paraflow errors.

One place, used by every backend: a collective that times out or loses a peer becomes a
:class:`~paraflow.errors.CollectiveTimeoutError` or :class:`~paraflow.errors.CollectiveError`
naming the collective, this rank and, when it can be known, the peer; a process group that
cannot start becomes a :class:`~paraflow.errors.LauncherError` naming the address, port and
world size. The original exception stays chained (``raise ... from``).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from typing import Any, Optional

from ..errors import CollectiveError, CollectiveTimeoutError, LauncherError, ParaflowError
from .last_words import dead_peers_text
from .stall import stall_facts

__all__ = [
    "collective_errors",
    "raise_translated",
    "translate_collective_error",
    "translate_on",
    "startup_errors",
    "is_timeout",
    "is_peer_lost",
    "error_line",
]

_TIMEOUT = re.compile(r"timed? ?out|timeout|deadline exceeded|stalled", re.IGNORECASE)
_PEER_LOST = re.compile(
    r"connection (?:closed|reset|refused)|broken pipe|end of file|\beof\b|"
    r"socket (?:closed|shut)|has been shut down|remote process exited|"
    r"communicator was aborted",
    re.IGNORECASE,
)
# Where a failure left a communication library (gloo's source paths, c10d's tags, horovod, MPI):
# only those errors are translated when they escape the training loop, not a user's own timeout.
_LIBRARY = re.compile(r"gloo|c10d|nccl|horovod|\bmpi\b|ProcessGroup", re.IGNORECASE)
_CLIENTS_JOINED = re.compile(r"(\d+)/(\d+) clients joined")
_ADDRESS_IN_USE = re.compile(r"EADDRINUSE|address already in use", re.IGNORECASE)


def is_timeout(exc: BaseException) -> bool:
    """True when `exc` says a wait ran out of time (gloo, the c10d store, horovod's stall check)."""
    return bool(_TIMEOUT.search(str(exc)))


def is_peer_lost(exc: BaseException) -> bool:
    """True when `exc` says the connection to another rank broke or horovod shut down."""
    return bool(_PEER_LOST.search(str(exc)))


def _peer(rank: int, world_size: int) -> str:
    """The other rank when there is only one, else a phrase for "some other rank"."""
    if world_size == 2:
        return f"rank {1 - rank}"
    return "another rank"


def error_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of `exc`'s message (its type's name when it has none), cut at `limit` characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _last_words() -> str:
    """What the records of ranks that died on this host say (paraflow.reliability.last_words), or ''."""
    try:
        text = dead_peers_text()
    except Exception:  # noqa: BLE001 - the error itself matters more than these words
        return ""
    return f" {text}" if text else ""


def translate_collective_error(
    exc: BaseException,
    *,
    collective: str,
    rank: int,
    world_size: int,
    backend: str,
    timeout: float,
    waited: float = 0.0,
    facts: str = "",
) -> Optional[CollectiveError]:
    """The paraflow error for `exc` raised inside `collective`, or None if it is not a communication failure.

    The result keeps `exc` as ``original``, so an outer call can name its own collective.

    Args:
        exc: what torch or horovod raised.
        collective: the paraflow call that was running ("allreduce", "barrier", ...).
        rank: this process's global rank.
        world_size: number of processes in the job.
        backend: the backend's registered name.
        timeout: the configured timeout in seconds.
        waited: seconds the collective had waited; a broken job found after the whole timeout
            (horovod shutting itself down) counts as a timeout.
        facts: appended to a timeout's message: the stall report seen before it (stall_facts).
    """
    if isinstance(exc, ParaflowError) or not isinstance(exc, RuntimeError):
        return None
    where = f"{collective} on rank {rank} of {world_size} (backend {backend})"
    peer = _peer(rank, world_size)
    cause = error_line(exc)
    translated: Optional[CollectiveError] = None
    if is_timeout(exc) or (is_peer_lost(exc) and waited >= timeout):
        translated = CollectiveTimeoutError(
            f"{where} timed out: {peer} did not join it within the timeout of {timeout:g} s. "
            f"That rank is stopped, stuck in other work, called a different collective, or its host "
            f"cannot be reached (a network link down); its own output says which. If the wait is "
            f"legitimate (a slow checkpoint, a long evaluation on one rank), raise the limit with "
            f"paraflow.init(timeout=SECONDS) or PARAFLOW_TIMEOUT. "
            f"[{type(exc).__name__}: {cause}]{facts}"
        )
    elif is_peer_lost(exc):
        translated = CollectiveError(
            f"{where} failed: the connection to {peer} was lost, so that rank exited or crashed. "
            f"Its own error, or the launcher's summary of failed ranks, says why. "
            f"[{type(exc).__name__}: {cause}]" + _last_words()
        )
    if translated is not None:
        translated.original = exc
    return translated


def translate_on(backend: Any, exc: BaseException, collective: str, waited: float = 0.0) -> Optional[CollectiveError]:
    """:func:`translate_collective_error` for `exc` raised inside `collective` on `backend`: its
    rank, world size, name and timeout, and its last stall report."""
    return translate_collective_error(
        exc,
        collective=collective,
        rank=backend.rank,
        world_size=backend.world_size,
        backend=backend.name,
        timeout=backend.timeout,
        waited=waited,
        facts=stall_facts(backend),
    )


def translate_escaped_error(backend: Any, exc: BaseException) -> Optional[CollectiveError]:
    """The paraflow error for torch's own communication failure leaving ``with paraflow.init()``, or None.

    DDP reduces gradients inside ``loss.backward()``, where paraflow has no hook: a lost or silent
    rank surfaces there as gloo's or NCCL's RuntimeError, naming neither rank nor call. A timeout
    carries the last stall report.
    """
    if not isinstance(exc, RuntimeError) or isinstance(exc, ParaflowError) or not _LIBRARY.search(str(exc)):
        return None
    frames, tb = [], exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    in_backward = any(f"torch{os.sep}autograd{os.sep}" in name for name in frames)
    return translate_on(
        backend,
        exc,
        "the gradient allreduce in loss.backward()"
        if in_backward
        else "the gradient allreduce (or another torch collective) in the training loop",
    )


@contextlib.contextmanager
def collective_errors(backend: Any, collective: str) -> Iterator[None]:
    """Context around one collective: communication failures leave it as paraflow errors.

    A failure a backend already translated for one of its own steps is translated again under
    the name of the collective the user called. (The public collectives, the hot path, do the
    same inline with :func:`raise_translated`.)
    """
    started = time.monotonic()
    try:
        yield
    except RuntimeError as exc:
        raise_translated(backend, collective, exc, started)
        raise


def raise_translated(backend: Any, collective: str, exc: RuntimeError, started: float) -> None:
    """Raise `exc` (a failure in `collective`, begun at time.monotonic() `started`) as the paraflow
    error it stands for; return when it is not a communication failure."""
    original = getattr(exc, "original", None) if isinstance(exc, CollectiveError) else exc
    translated = original is not None and translate_on(backend, original, collective, time.monotonic() - started)
    if translated:
        raise translated from original


@contextlib.contextmanager
def startup_errors(
    *, rank: int, world_size: int, address: Optional[str], port: Optional[int], timeout: float, launcher: str
) -> Iterator[None]:
    """Context around starting a process group: a taken port or missing ranks become LauncherError.

    Args:
        rank: this process's global rank.
        world_size: the number of processes the launcher announced.
        address: rank 0's address (MASTER_ADDR), if known.
        port: rank 0's port (MASTER_PORT), if known.
        timeout: the configured timeout in seconds.
        launcher: the launcher that started this process.
    """
    try:
        yield
    except RuntimeError as exc:
        if isinstance(exc, ParaflowError):
            raise
        endpoint = f"{address or '?'}:{port or '?'}"
        if _ADDRESS_IN_USE.search(str(exc)):
            raise LauncherError(
                f"rank {rank} could not open the rendezvous at {endpoint}: port {port} on {address} "
                f"is already in use by another process (another job, or a previous run that is "
                f"still alive). Choose a free port: set MASTER_PORT (torchrun --master_port) to "
                f"another value, or leave MASTER_ADDR/MASTER_PORT unset under mpirun so paraflow "
                f"picks a free one."
            ) from exc
        joined = _CLIENTS_JOINED.search(str(exc))
        if joined or is_timeout(exc):
            count = f"only {joined.group(1)} of {joined.group(2)}" if joined else "not all"
            raise LauncherError(
                f"the launcher ({launcher}) says the job has {world_size} processes, but {count} "
                f"joined the rendezvous at {endpoint} within the timeout of {timeout:g} s (seen "
                f"from rank {rank}). Start exactly as many processes as the world size (torchrun "
                f"--nproc_per_node {world_size}, mpirun -np {world_size}), check that no rank failed "
                f"to start (rank 0 says so if the port was taken), and that every rank can reach "
                f"{endpoint}."
            ) from exc
        raise
