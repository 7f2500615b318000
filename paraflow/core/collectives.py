"""The public collectives every backend shares: each is one call into the backend's library.

A public call checks its input, records this rank's phase for the stall report
(:mod:`paraflow.reliability.activity`), makes one library collective through a subclass hook
(``_allreduce``, ``_broadcast``, ``_allgather``, optionally ``_barrier``) and translates a
communication failure into a paraflow error (:mod:`paraflow.reliability.translation`). With
``check_collectives`` (``PARAFLOW_DEBUG=1``) a small descriptor allgather before the call first
checks that every rank makes the same one (:mod:`paraflow.reliability.collective_check`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, ContextManager

import torch

from ..errors import ConfigurationError
from ..reliability.activity import call_site
from ..reliability.collective_check import check_same_call
from ..reliability.translation import raise_translated
from .options import REDUCE_OPS

__all__ = ["Collectives", "LocalCollectives"]


class Collectives:
    """allreduce, broadcast, allgather and barrier over the ranks of an initialised backend.

    ``collective_count`` is the number of public collectives this rank has made in a job of
    several processes.
    """

    collective_count = 0
    #: This rank's phase for the stall report (paraflow.reliability.activity); None in one process.
    _activity = None
    #: Whether every collective is first checked across ranks (check_collectives, PARAFLOW_DEBUG).
    check_collectives = False

    def allreduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """Reduce `tensor` over all ranks with `op` (sum, mean, min, max); input is unchanged."""
        self._check_allreduce(tensor, op)
        result = self._call("allreduce", tensor, op, lambda: self._allreduce(tensor.detach().clone(), op))
        return result.to(tensor.device)

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce `tensor` over all ranks with `op`, in place (no copy); returns `tensor`."""
        self._check_allreduce(tensor, op)
        return self._into(tensor, self._call("allreduce", tensor, op, lambda: self._allreduce(tensor.detach(), op)))

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Return rank `src`'s `tensor` on every rank; input is unchanged."""
        self._check_broadcast(tensor, src)
        result = self._call("broadcast", tensor, src, lambda: self._broadcast(tensor.detach().clone(), src))
        return result.to(tensor.device)

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite `tensor` with rank `src`'s, in place (no copy); returns `tensor`."""
        self._check_broadcast(tensor, src)
        return self._into(tensor, self._call("broadcast", tensor, src, lambda: self._broadcast(tensor.detach(), src)))

    def allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Return every rank's `tensor` (same shape on all ranks), indexed by rank."""
        self._check_tensor(tensor, "allgather")
        gathered = self._call("allgather", tensor, None, lambda: self._allgather(tensor.detach().contiguous()))
        return [t.to(tensor.device) for t in gathered]

    def barrier(self) -> None:
        """Wait until every rank reaches this call."""
        self._live()
        self._call("barrier", None, None, self._barrier)

    def _call(self, collective: str, tensor: Any, argument: Any, run: Callable[[], Any]) -> Any:
        """Run one public collective: `run()` makes the library call; `argument` is the op or source."""
        site = call_site()
        started, activity = time.monotonic(), self._activity
        if activity is not None:
            activity.enter(collective, site, (self.collective_count + 1, tensor, argument))
        try:
            if self.env.world_size > 1:
                self.collective_count += 1
                if self.check_collectives:
                    check_same_call(self, self.collective_count, collective, tensor, argument, site)
            return run()
        except RuntimeError as exc:
            if activity is not None:
                activity.failed()
            raise_translated(self, collective, exc, started)
            raise
        finally:
            if activity is not None:
                activity.leave(collective)

    def _marked(self, call: str) -> ContextManager:
        """Record `call` as this rank's phase while it runs (read only by the stall report)."""
        return contextlib.nullcontext() if self._activity is None else self._activity.call(call)

    @staticmethod
    def _into(tensor: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
        """`tensor`, holding `result` (a backend may return the result in other memory)."""
        if result is not tensor and result.data_ptr() != tensor.data_ptr():
            tensor.detach().copy_(result)
        return tensor

    # ---------------------------------------------------------------- for subclasses
    def _allreduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        """Reduce `tensor` (the caller's or a private copy) in place or not; return the result."""
        raise NotImplementedError

    def _broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Broadcast `tensor` from `src` and return the result."""
        raise NotImplementedError

    def _allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Gather `tensor` from every rank, indexed by rank."""
        raise NotImplementedError

    def _barrier(self) -> None:
        """Block until every rank arrives (default: a one-element allreduce)."""
        self._allreduce(torch.zeros(1, device=self.device), "sum")

    # ---------------------------------------------------------------- input checks
    def _check_allreduce(self, tensor: Any, op: str) -> None:
        self._check_tensor(tensor, "allreduce")
        if op not in REDUCE_OPS:
            raise ConfigurationError(f"allreduce op {op!r} is not one of {', '.join(REDUCE_OPS)}.")
        if op == "mean" and not (tensor.is_floating_point() or tensor.is_complex()):
            raise ConfigurationError(
                f"allreduce op 'mean' needs a floating-point tensor, got {tensor.dtype}; "
                "use op='sum' and divide, or convert with tensor.double()."
            )

    def _check_broadcast(self, tensor: Any, src: int) -> None:
        self._check_tensor(tensor, "broadcast")
        if not 0 <= src < self.world_size:
            raise ConfigurationError(f"broadcast src={src} is outside ranks 0..{self.world_size - 1}.")

    def _check_tensor(self, tensor: Any, collective: str) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise ConfigurationError(f"{collective} takes a torch.Tensor, got {type(tensor).__name__}.")
        self._live()


class LocalCollectives:
    """Collectives for a single process: every result is this process's own tensor."""

    def _allreduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        return tensor

    def _broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        return tensor

    def _allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return [tensor.clone()]

    def barrier(self) -> None:
        """Nothing to wait for in one process."""
        self._live()
