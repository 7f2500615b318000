"""The public collectives every backend shares, turned into a few subclass hooks.

The public calls check their input, agree across ranks on what is called
(:mod:`paraflow.reliability.check_exchange`) and translate communication failures
(:mod:`paraflow.reliability.translation`); a backend implements only ``_allreduce``,
``_broadcast``, ``_allgather`` (or their asynchronous forms ``_start_allreduce``,
``_start_broadcast``, ``_start_allgather``, which also let the check overlap a repeated
collective) and optionally ``_barrier``. A loop's repeated call, once the check's board is open,
takes a short path with the same check (:mod:`paraflow.core.repeated_call`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, ContextManager, Optional

import torch

from ..errors import ConfigurationError
from ..reliability.check_exchange import exchange
from ..reliability.collective_check import call_site
from ..reliability.translation import collective_errors, raise_translated
from .options import REDUCE_OPS
from .repeated_call import RepeatedCall

__all__ = ["Collectives", "LocalCollectives"]


class Collectives(RepeatedCall):
    """allreduce, broadcast, allgather and barrier over the ranks of an initialised backend.

    ``collective_count`` is the number of checked collectives this rank has started.
    """

    collective_count = 0
    #: This rank's phase for the stall report (paraflow.reliability.activity); None in one process.
    _activity = None

    def allreduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """Reduce `tensor` over all ranks with `op` (sum, mean, min, max); input is unchanged."""
        result = self._repeat("allreduce", tensor, op, copy=True)
        if result is None:
            result = self._allreduce_checked(tensor, op, copy=True)
        return result.to(tensor.device)

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce `tensor` over all ranks with `op`, in place (no copy); returns `tensor`."""
        result = self._repeat("allreduce", tensor, op, copy=False)
        if result is None:
            result = self._allreduce_checked(tensor, op, copy=False)
        if result is not tensor and result.data_ptr() != tensor.data_ptr():
            tensor.detach().copy_(result)
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Return rank `src`'s `tensor` on every rank; input is unchanged."""
        result = self._repeat("broadcast", tensor, src, copy=True)
        if result is None:
            result = self._broadcast_checked(tensor, src, copy=True)
        return result.to(tensor.device)

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite `tensor` with rank `src`'s, in place (no copy); returns `tensor`."""
        result = self._repeat("broadcast", tensor, src, copy=False)
        if result is None:
            result = self._broadcast_checked(tensor, src, copy=False)
        if result is not tensor and result.data_ptr() != tensor.data_ptr():
            tensor.detach().copy_(result)
        return tensor

    def allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Return every rank's `tensor` (same shape on all ranks), indexed by rank."""
        gathered = self._repeat("allgather", tensor, None, copy=False)
        if gathered is None:
            self._check_tensor(tensor, "allgather")
            gathered = self._checked(
                "allgather",
                tensor.contiguous(),
                self._allgather,
                self._start_allgather,
                lambda rows: rows,
            )
        return [t.to(tensor.device) for t in gathered]

    def barrier(self) -> None:
        """Wait until every rank reaches this call."""
        self._live()
        with collective_errors(self, "barrier"), self._marked("barrier"):
            if self.world_size > 1:
                self.collective_count += 1
                exchange(self, self.collective_count, "barrier")
            self._barrier()

    def _allreduce_checked(self, tensor: torch.Tensor, op: str, copy: bool) -> torch.Tensor:
        self._check_tensor(tensor, "allreduce")
        self._check_allreduce_op(tensor, op)
        return self._checked(
            "allreduce",
            tensor,
            lambda work: self._allreduce(work, op),
            self._start_allreduce and (lambda work: self._start_allreduce(work, op)),
            lambda rows: _reduce(rows, op),
            copy=copy,
            op=op,
        )

    def _broadcast_checked(self, tensor: torch.Tensor, src: int, copy: bool) -> torch.Tensor:
        self._check_tensor(tensor, "broadcast")
        if not 0 <= src < self.world_size:
            raise ConfigurationError(f"broadcast src={src} is outside ranks 0..{self.world_size - 1}.")
        return self._checked(
            "broadcast",
            tensor,
            lambda work: self._broadcast(work, src),
            self._start_broadcast and (lambda work: self._start_broadcast(work, src)),
            lambda rows: rows[src],
            copy=copy,
            src=src,
        )

    def _checked(
        self,
        collective: str,
        tensor: torch.Tensor,
        run: Callable,
        start: Optional[Callable],
        combine: Callable,
        copy: bool = False,
        **arguments: Any,
    ):
        """One public collective: all ranks must agree on it (paraflow.reliability.check_exchange), and
        communication failures leave as paraflow errors (paraflow.reliability.translation).

        `run(work)` runs the collective on `work` (`tensor`, or a copy of it with `copy`), `start(work)`
        starts it and returns the function that waits (None: the backend cannot start it
        asynchronously), `combine(rows)` makes the result from every rank's tensor when the check
        carried them.
        """

        def work() -> torch.Tensor:
            if copy:
                return tensor.detach().clone()
            return tensor.detach() if tensor.requires_grad else tensor

        site = call_site()  # once, for the stall report and the check
        # What `with collective_errors(...), self._marked(...)` does, inline: it wraps every call.
        started, activity = time.monotonic(), self._activity
        if activity is not None:
            activity.enter(collective, site)
        try:
            if self.env.world_size == 1:
                return run(work())
            self.collective_count += 1
            sequence = self.collective_count
            outcome = exchange(
                self,
                sequence,
                collective,
                tensor,
                carry=True,
                start=start and (lambda: start(work())),
                in_place=not copy,
                site=site,
                **arguments,
            )
            if outcome.carried is not None:
                return combine(outcome.carried)
            return outcome.finish() if outcome.finish is not None else run(work())
        except RuntimeError as exc:
            raise_translated(self, collective, exc, started)
            raise
        finally:
            if activity is not None:
                activity.leave(collective)

    def _release_check(self) -> None:
        """Forget what the ranks agreed on and release the check's shared memory (at shutdown)."""
        board = getattr(self, "_check_board", None)
        if board:
            board.close()
        self._check_board = self._agreed_run = self._last_agreed = self._bundle_buffer = self._traced = None
        self._repeat_descriptor = None

    def _marked(self, call: str, site: Optional[str] = None) -> ContextManager:
        """Record `call` (made at `site`) as this rank's phase while it runs (read only by the stall report)."""
        return contextlib.nullcontext() if self._activity is None else self._activity.call(call, site)

    # ---------------------------------------------------------------- for subclasses
    #: Optional asynchronous forms of the hooks, each returning a function that waits and gives the
    #: result: with them the check and a repeated collective overlap (check_exchange.py).
    _start_allreduce: Optional[Callable] = None
    _start_broadcast: Optional[Callable] = None
    _start_allgather: Optional[Callable] = None

    def _allreduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        """Reduce the private copy `tensor` in place or not, and return the result (default: start, wait)."""
        return self._asynchronous("_start_allreduce")(tensor, op)()

    def _broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Broadcast the private copy `tensor` from `src` and return it (default: start, wait)."""
        return self._asynchronous("_start_broadcast")(tensor, src)()

    def _allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Gather `tensor` from every rank (default: start, wait)."""
        return self._asynchronous("_start_allgather")(tensor)()

    def _asynchronous(self, hook: str) -> Callable:
        start = getattr(self, hook)
        if start is None:
            raise NotImplementedError(
                f"{type(self).__name__} implements neither {hook} nor {hook.replace('_start', '')}"
            )
        return start

    def _barrier(self) -> None:
        """Block until every rank arrives (default: a one-element allreduce)."""
        self._allreduce(torch.zeros(1, device=self.device), "sum")

    @staticmethod
    def _check_allreduce_op(tensor: torch.Tensor, op: str) -> None:
        if op not in REDUCE_OPS:
            raise ConfigurationError(f"allreduce op {op!r} is not one of {', '.join(REDUCE_OPS)}.")
        if op == "mean" and not (tensor.is_floating_point() or tensor.is_complex()):
            raise ConfigurationError(
                f"allreduce op 'mean' needs a floating-point tensor, got {tensor.dtype}; "
                "use op='sum' and divide, or convert with tensor.double()."
            )

    def _check_tensor(self, tensor: Any, collective: str) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise ConfigurationError(f"{collective} takes a torch.Tensor, got {type(tensor).__name__}.")
        self._live()


def _reduce(tensors: list, op: str) -> torch.Tensor:
    """`op` over every rank's tensor, in rank order (the same arithmetic on every rank)."""
    result = tensors[0]  # fresh memory from the exchange
    for other in tensors[1:]:
        if op in ("sum", "mean"):
            result.add_(other)
        else:
            torch.maximum(result, other, out=result) if op == "max" else torch.minimum(result, other, out=result)
    if op == "mean":
        result.div_(len(tensors))
    return result


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
