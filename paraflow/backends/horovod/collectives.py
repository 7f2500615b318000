"""Horovod's collectives behind paraflow's public calls, each wait bounded by the timeout.

Horovod's own wait (``synchronize``) spins on the handle with no timeout. The public collectives
poll their handle the same way on the calling thread and give up after the backend's timeout
(so the error can be caught); every other horovod wait
(broadcasts in ``wrap_model`` and ``wrap_optimizer``, the gradient wait in ``step()``, barriers,
``join``) runs under the watchdog (:mod:`paraflow.reliability.deadlines`), which costs nothing
while it ends in time. Horovod's errors become paraflow's, naming the call and this rank.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ...errors import CollectiveError, ConfigurationError
from ...reliability.deadlines import DeadlineExceeded, spin_until, watchdog
from ...reliability.stall import stall_facts
from ...reliability.translation import translate_collective_error

__all__ = ["HorovodCollectives"]

_COLLECTIVE_OPS = {"sum": "Sum", "mean": "Average", "min": "Min", "max": "Max"}
#: Under gloo horovod's own timeout (HOROVOD_GLOO_TIMEOUT_SECONDS) ends a wait with an error that
#: can be caught; the watchdog acts only this much later, if that did not happen.
_GLOO_GRACE_S = 10.0


class HorovodCollectives:
    """allreduce, broadcast, allgather and barrier through horovod, for :class:`HorovodBackend`."""

    # One horovod operation each, behind the public collectives (paraflow.core.collectives).
    def _allreduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        what = f"allreduce ({op}) of a {_describe(tensor)}"
        hvd = self._horovod()
        with self.horovod_errors(what):
            handle = hvd.allreduce_async_(
                tensor.contiguous(), name=f"paraflow.allreduce.{op}", op=getattr(hvd, _COLLECTIVE_OPS[op])
            )
            return self._wait(handle)

    def _broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        what = f"broadcast from rank {src} of a {_describe(tensor)}"
        hvd = self._horovod()
        with self.horovod_errors(what):
            handle = hvd.broadcast_async_(tensor.contiguous(), root_rank=src, name=f"paraflow.broadcast.{src}")
            return self._wait(handle)

    def _allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        # One leading row per rank: horovod then requires every other dimension to agree.
        what = f"allgather of a {_describe(tensor)}"
        hvd = self._horovod()
        with self.horovod_errors(what):
            handle = hvd.allgather_async(tensor.reshape(1, *tensor.shape), name="paraflow.allgather")
            return list(self._wait(handle).unbind(0))

    def _barrier(self) -> None:
        """Wait for every rank (horovod's barrier)."""
        hvd = self._horovod()
        with self.horovod_errors("barrier"), self.bounded("barrier"):
            hvd.barrier()

    # ---------------------------------------------------------------- helpers
    def _wait(self, handle: int) -> Any:
        """``hvd.synchronize(handle)`` once ``hvd.poll`` finds it done, failing after the timeout
        instead of waiting forever.

        Horovod's own wait spins on the handle with no timeout: a rank that stops answering
        would block the others for good. This one spins the same way, on this thread, with a
        deadline (:func:`paraflow.reliability.deadlines.spin_until`). After a timeout horovod's
        background thread may be stuck, so shutdown leaves horovod alone (MPI_Abort or horovod's
        exit handler ends it).
        """
        hvd = self._hvd
        try:
            spin_until(lambda: hvd.poll(handle), self.timeout, "waiting for the other ranks")
        except DeadlineExceeded:
            self._stuck = True
            raise
        return hvd.synchronize(handle)

    def bounded(self, what: str):
        """Context around a horovod wait that cannot be polled: once it outlives the timeout the
        watchdog prints its CollectiveTimeoutError and ends the process (MPI_Abort under MPI)."""
        grace = 0.0 if self.controller == "mpi" else _GLOO_GRACE_S
        return watchdog.watch(self.timeout + grace, lambda waited: self._past_timeout(what, waited))

    def _past_timeout(self, what: str, waited: float) -> str:
        error = translate_collective_error(
            DeadlineExceeded(f"waiting timed out after {waited:.0f} s"),
            collective=f"horovod {what}",
            rank=self.rank,
            world_size=self.world_size,
            backend=self.name,
            timeout=self.timeout,
            waited=waited,
        )
        kind = f"{type(error).__module__}.{type(error).__name__}"
        return (
            f"paraflow: rank {self.rank}: horovod's wait cannot be interrupted and outlived the timeout, so this "
            f"process ends now (the launcher then ends the job).\n{kind}: {error}"
        )

    def _horovod(self):
        self._live()
        if self._hvd is None or self.controller is None:
            raise self._not_initialized()
        return self._hvd

    def horovod_errors(self, what: str) -> _HorovodErrors:
        """Context turning horovod's errors into paraflow's, naming the collective and this rank.

        Horovod's gloo controller reports a rank that stopped answering as "Horovod has been shut
        down" once its own timeout runs out, counted from when the job last made progress: so the
        wait is measured from the end of this rank's last horovod call, if that came earlier.
        """
        return _HorovodErrors(self, what)

    def _raise_horovod_error(self, what: str, exc: Exception, start: float) -> None:
        """Raise the paraflow error for horovod's `exc` in `what`, begun at time.monotonic() `start`."""
        if isinstance(exc, ValueError):  # horovod refuses the tensor itself (dtype, layout)
            raise ConfigurationError(f"horovod cannot run the {what}: {exc}") from exc
        translated = translate_collective_error(  # a timeout or a lost rank: paraflow.reliability.translation
            exc,
            collective=f"horovod {what}",
            rank=self.rank,
            world_size=self.world_size,
            backend=self.name,
            timeout=self.timeout,
            waited=time.monotonic() - min(start, getattr(self, "_progress_at", start)),
            facts=stall_facts(self),
        )
        if translated is not None:
            raise translated from exc
        raise CollectiveError(  # HorovodInternalError: ranks disagree, or the job broke
            f"horovod {what} failed on rank {self.rank}: {str(exc).rstrip('.')}. Every rank must call the same "
            "collectives in the same order with tensors of the same shape and dtype."
        ) from exc


class _HorovodErrors:
    """What ``horovod_errors`` returns; an object, not a generator, since every training step enters one.
    Not re-entrant: one block at a time per object."""

    __slots__ = ("_backend", "_what", "_start")

    def __init__(self, backend: HorovodCollectives, what: str) -> None:
        self._backend, self._what = backend, what

    def __enter__(self) -> None:
        self._start = time.monotonic()

    def __exit__(self, kind, exc, traceback) -> bool:
        if kind is None:
            self._backend._progress_at = time.monotonic()
        elif issubclass(kind, (ValueError, RuntimeError)):
            self._backend._raise_horovod_error(self._what, exc, self._start)
        return False


def _describe(tensor: torch.Tensor) -> str:
    return f"{tensor.dtype} tensor of shape {list(tensor.shape)}"
