"""Turn communication failures from torch and horovod into paraflow errors.

One place, used by every backend: a collective that times out or loses a peer becomes a
:class:`~paraflow.errors.CollectiveTimeoutError` or :class:`~paraflow.errors.CollectiveError`
naming the collective, this rank and, when it can be known, the peer; a process group that
cannot start becomes a :class:`~paraflow.errors.LauncherError` naming the address, port and
world size. The original exception stays chained (``raise ... from``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from torch.nn.parallel import DistributedDataParallel

from ..errors import CollectiveError, CollectiveTimeoutError, ConfigurationError, LauncherError, ParaflowError

if TYPE_CHECKING:
    from torch import nn

    from ..core.backend import Backend

__all__ = [
    "collective_errors",
    "translate_collective_error",
    "startup_errors",
    "call_with_deadline",
    "wait_until",
    "DeadlineExceeded",
    "abort_mpi_job_on_uncaught_error",
    "store_for_this_attempt",
    "unused_parameters_error",
    "CheckedDistributedDataParallel",
    "is_timeout",
    "is_peer_lost",
]

_TIMEOUT = re.compile(r"timed? ?out|timeout|deadline exceeded|stalled", re.IGNORECASE)
_PEER_LOST = re.compile(
    r"connection (?:closed|reset|refused)|broken pipe|end of file|\beof\b|"
    r"socket (?:closed|shut)|has been shut down|remote process exited|"
    r"communicator was aborted",
    re.IGNORECASE,
)
_CLIENTS_JOINED = re.compile(r"(\d+)/(\d+) clients joined")
_ADDRESS_IN_USE = re.compile(r"EADDRINUSE|address already in use", re.IGNORECASE)
_UNUSED_NAMES = re.compile(r"Parameters which did not receive grad for rank \d+: ([^\n]+)")
_UNUSED_INDICES = re.compile(r"Parameter indices which did not receive grad for rank \d+: ([\d ]+)")


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


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def translate_collective_error(
    exc: BaseException,
    *,
    collective: str,
    rank: int,
    world_size: int,
    backend: str,
    timeout: float,
    waited: float = 0.0,
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
    """
    if isinstance(exc, ParaflowError) or not isinstance(exc, RuntimeError):
        return None
    where = f"{collective} on rank {rank} of {world_size} (backend {backend})"
    peer = _peer(rank, world_size)
    cause = _first_line(exc)
    translated: Optional[CollectiveError] = None
    if is_timeout(exc) or (is_peer_lost(exc) and waited >= timeout):
        translated = CollectiveTimeoutError(
            f"{where} timed out: {peer} did not join it within the timeout of {timeout:g} s. "
            f"That rank is stopped, stuck in other work, or called a different collective; its own "
            f"output says which. If the wait is legitimate (a slow checkpoint, a long evaluation on "
            f"one rank), raise the limit with paraflow.init(timeout=SECONDS) or PARAFLOW_TIMEOUT. "
            f"[{type(exc).__name__}: {cause}]"
        )
    elif is_peer_lost(exc):
        translated = CollectiveError(
            f"{where} failed: the connection to {peer} was lost, so that rank exited or crashed. "
            f"Its own error, or the launcher's summary of failed ranks, says why. "
            f"[{type(exc).__name__}: {cause}]"
        )
    if translated is not None:
        translated.original = exc
    return translated


@contextlib.contextmanager
def collective_errors(backend: Backend, collective: str) -> Iterator[None]:
    """Context around one collective: communication failures leave it as paraflow errors.

    A failure a backend already translated for one of its own steps is translated again under
    the name of the collective the user called.
    """
    start = time.monotonic()
    try:
        yield
    except RuntimeError as exc:
        original = getattr(exc, "original", None) if isinstance(exc, CollectiveError) else exc
        translated = original is not None and translate_collective_error(
            original,
            collective=collective,
            rank=backend.rank,
            world_size=backend.world_size,
            backend=backend.name,
            timeout=backend.timeout,
            waited=time.monotonic() - start,
        )
        if not translated:
            raise
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


_T = TypeVar("_T")


class DeadlineExceeded(RuntimeError):
    """A blocking call that did not return in time (its message says "timed out")."""


def call_with_deadline(fn: Callable[[], _T], seconds: float, what: str) -> _T:
    """Run `fn` in a helper thread and return its result, or raise once `seconds` have passed.

    For calls that can block without a timeout of their own (a rendezvous client talking to a
    port that another program holds). On expiry the thread is left blocked as a daemon; the
    caller is expected to fail.
    """
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=f"paraflow {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise DeadlineExceeded(f"{what} timed out after {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def wait_until(done: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll `done` (backing off from 10 µs to 0.2 ms) until it is true; fail once `seconds` have passed.

    For libraries whose own wait has no timeout (a horovod handle under the MPI controller).

    Raises:
        RuntimeError: saying "`what` timed out after `seconds` s" (translated by
            :func:`collective_errors` into CollectiveTimeoutError).
    """
    deadline = time.monotonic() + seconds
    pause = 1e-5
    while not done():
        if time.monotonic() > deadline:
            raise DeadlineExceeded(f"{what} timed out after {seconds:g} s")
        time.sleep(pause)
        pause = min(2 * pause, 2e-4)


def unused_parameters_error(
    exc: BaseException, module: nn.Module, rank: int, option_hint: str
) -> Optional[ConfigurationError]:
    """The paraflow error for DDP's "parameters that were not used in producing loss", or None.

    Args:
        exc: what DistributedDataParallel raised.
        module: the user's module inside the DDP wrapper, to name parameters by index.
        rank: this process's global rank.
        option_hint: how to pass find_unused_parameters with this backend.
    """
    text = str(exc)
    if "find_unused_parameters" not in text:
        return None
    names = _UNUSED_NAMES.search(text)
    if names:
        unused = names.group(1).strip()
    else:
        indices = _UNUSED_INDICES.search(text)
        trained = [n for n, p in module.named_parameters() if p.requires_grad]
        numbers = [int(i) for i in indices.group(1).split()] if indices else []
        picked = [trained[i] for i in numbers if i < len(trained)]
        unused = ", ".join(picked) or "(see the error below)"
    return ConfigurationError(
        f"rank {rank}: parameters received no gradient in the last backward pass: {unused}. "
        f"DistributedDataParallel must be told: pass find_unused_parameters=True "
        f"({option_hint}); it costs one extra walk over the autograd graph per step. Or make "
        f"every parameter contribute to the loss, or freeze the unused ones with "
        f"requires_grad=False before wrap_model. Horovod needs no option: its "
        f"DistributedOptimizer allreduces a zero gradient for a parameter that got none (so "
        f"momentum and weight decay still move it); freeze such parameters there too."
    )


def store_for_this_attempt(address: str, port: int, world_size: int, timeout: float):
    """torchrun's agent store under a prefix for this restart attempt, or None without an agent store.

    torchrun's static rendezvous (the default with --master_addr/--master_port) keeps one store
    across restarts and torch adds no per-attempt prefix, so a restarted rank can read the
    address a killed rank published before and fail to connect (seen here in about half the
    restarts). A prefix per TORCHELASTIC_RESTART_COUNT keeps the attempts apart.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    import torch.distributed as dist

    store = dist.TCPStore(address, port, world_size, is_master=False, timeout=datetime.timedelta(seconds=timeout))
    return dist.PrefixStore(f"/paraflow/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def abort_mpi_job_on_uncaught_error() -> None:
    """Under MPI, make an uncaught exception abort the whole job once its traceback is printed.

    Otherwise the failing rank waits at exit in MPI_Finalize for ranks that may never get there
    (one that is stopped, or blocked in a collective), and the job hangs. Acts only when mpi4py
    has started MPI in this process; safe to call more than once.
    """
    previous = sys.excepthook
    if getattr(previous, "paraflow_aborts_mpi", False):
        return

    def excepthook(kind, value, traceback) -> None:
        previous(kind, value, traceback)
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            sys.stdout.flush()
            sys.stderr.flush()
            mpi.COMM_WORLD.Abort(1)

    excepthook.paraflow_aborts_mpi = True
    sys.excepthook = excepthook


class CheckedDistributedDataParallel(DistributedDataParallel):
    """torch's DistributedDataParallel, whose unused-parameter error names the parameters and
    says how to pass find_unused_parameters through paraflow."""

    paraflow_backend_name = "ddp"

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """DistributedDataParallel.forward, with its unused-parameter error translated."""
        try:
            return super().forward(*inputs, **kwargs)
        except RuntimeError as exc:
            hint = f"paraflow.init({self.paraflow_backend_name!r}, find_unused_parameters=True)"
            error = unused_parameters_error(exc, self.module, self.process_group.rank(), hint)
            if error is None:
                raise
            raise error from exc
