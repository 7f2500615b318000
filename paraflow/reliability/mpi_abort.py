"""How a failing rank leaves the job, so that the job's last words name the rank that failed first.

Under ``mpirun`` and ``horovodrun`` the launcher ends the job when one process fails, and its
summary names the process it saw fail first. Two things used to hide the real culprit:

- a failing rank stayed connected until exit, then waited in ``MPI_Finalize`` for ranks that
  were not coming, while a survivor that lost the connection to it called ``MPI_Abort`` or exited
  first: the summary blamed the survivor ("MPI_ABORT was invoked on rank 0");
- a survivor that lost a rank SIGKILLed a moment earlier could abort before the launcher noticed
  the kill, and the kill went unnamed.

So a rank that leaves on an error (uncaught exception, or ``sys.exit(code)`` out of
``with paraflow.init()``) ends at once under MPI with ``MPI_Abort`` after its traceback (the
summary then names it), and a rank whose error says it lost a peer waits up to
:data:`PEER_LOST_GRACE_S` for the launcher to end the job and name the rank that failed first,
before it prints its own traceback and leaves: that traceback, printed after the launcher's
summary, would otherwise be the job's last words, naming the lost rank but not why it failed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
from typing import Optional

from ..errors import CollectiveError, CollectiveTimeoutError
from .last_words import job_directory, mark_ended, report_dead_ranks
from .translation import is_peer_lost, is_timeout

__all__ = ["abort_mpi_job_on_uncaught_error", "leave_job_on_exit", "end_job", "lost_a_peer", "PEER_LOST_GRACE_S"]

#: Longest a rank that lost a peer waits for the launcher to report the rank that failed first.
PEER_LOST_GRACE_S = 10.0
#: Longest a rank leaving on an error waits for a dying peer's process to end, to report it.
LAST_WORDS_SETTLE_S = 2.0


def _mpi():
    """mpi4py's MPI module when MPI runs in this process, else None."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi
    return None


def end_job(code: int) -> None:
    """End this process at once so that the launcher ends the job: MPI_Abort when MPI runs here, else exit.

    For a process whose main thread cannot be woken (a wait inside a library with no timeout).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    mark_ended()
    mpi = _mpi()
    if mpi is not None:
        mpi.COMM_WORLD.Abort(code)
    os._exit(code)


def lost_a_peer(exc: Optional[BaseException]) -> bool:
    """Whether `exc` (or what it was raised from) says the connection to another rank broke.

    A timeout is not: then this rank is the one that noticed a silent peer, and reports it.
    """
    seen = 0
    lost = False
    while exc is not None and seen < 8:
        if isinstance(exc, CollectiveTimeoutError) or (not isinstance(exc, CollectiveError) and is_timeout(exc)):
            return False
        lost = lost or (isinstance(exc, CollectiveError) and "was lost" in str(exc)) or is_peer_lost(exc)
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return lost


def abort_mpi_job_on_uncaught_error(rank: int, world_size: int, mpi_launcher: bool = True) -> None:
    """Make an uncaught exception end this rank's part in the job the way described above.

    A rank that lost a peer first waits up to :data:`PEER_LOST_GRACE_S` for the launcher (which normally
    ends it meanwhile); then the traceback is printed, followed (unless the error is a lost peer,
    which the error itself names) by ``paraflow: rank R of N left the job on an uncaught ...``, so
    paraflow's own output names the failing rank, not only the launcher's summary. Under MPI (when
    mpi4py started it) the whole job is then aborted instead of waiting in MPI_Finalize. Safe to
    call more than once.

    Args:
        rank, world_size: this process's rank and the job's size, for the line.
        mpi_launcher: whether an MPI launcher started this process (else only the wait applies).
    """
    previous = sys.excepthook
    if getattr(previous, "paraflow_aborts_mpi", False):
        return

    def excepthook(kind, value, traceback) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        # At once (the launcher may end this process during the wait below), after the peers whose
        # library is aborting them right now (this error may be what their end did to this rank).
        with contextlib.suppress(Exception):  # never in the way of the traceback
            report_dead_ranks(job_directory(), settle=LAST_WORDS_SETTLE_S, in_collectives=True)
        lost = lost_a_peer(value)
        if lost:
            time.sleep(PEER_LOST_GRACE_S)  # the launcher sees the rank that failed first, and ends this one meanwhile
        previous(kind, value, traceback)
        mpi = _mpi() if mpi_launcher else None
        if not lost:
            message = " ".join(str(value).split())
            message = message if len(message) <= 200 else message[:199] + "…"
            sys.stderr.write(
                f"paraflow: rank {rank} of {world_size} left the job on an uncaught {kind.__name__}"
                f"{': ' + message if message else ''}{'; aborting the MPI job' if mpi is not None else ''}.\n"
            )
        sys.stdout.flush()
        sys.stderr.flush()
        if mpi is not None:
            end_job(1)

    excepthook.paraflow_aborts_mpi = True
    sys.excepthook = excepthook


def leave_job_on_exit(exc: BaseException, rank: int, world_size: int) -> None:
    """For ``sys.exit(code)`` out of ``with paraflow.init()``: at exit, say so and, under MPI, abort
    the job with that code instead of waiting in MPI_Finalize (the launcher then names this rank).

    Registered after the backend's own shutdown, so it runs before it (atexit runs last-in first).
    """
    if not isinstance(exc, SystemExit) or exc.code in (None, 0):
        return
    code = exc.code if isinstance(exc.code, int) else 1

    def leave() -> None:
        mpi = _mpi()
        sys.stdout.flush()
        sys.stderr.write(
            f"paraflow: rank {rank} of {world_size} left the job with exit status {code} (sys.exit out of "
            f"paraflow.init){'; aborting the MPI job' if mpi is not None else ''}.\n"
        )
        sys.stderr.flush()
        if mpi is not None:
            end_job(code)

    atexit.register(leave)
