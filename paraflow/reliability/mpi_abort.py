"""Under MPI, an uncaught exception on one rank ends the whole job instead of hanging it."""

from __future__ import annotations

import sys

__all__ = ["abort_mpi_job_on_uncaught_error"]


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
