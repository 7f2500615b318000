"""The public collectives every backend shares, turned into a few subclass hooks.

The public calls check their input, agree across ranks on what is called
(:mod:`paraflow.reliability.collective_check`) and translate communication failures
(:mod:`paraflow.reliability.translation`); a backend implements only ``_allreduce``,
``_broadcast``, ``_allgather`` and optionally ``_barrier``.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator
from typing import Any, Optional

import torch

from ..errors import ConfigurationError
from ..reliability.collective_check import check_collective
from ..reliability.translation import collective_errors
from .options import REDUCE_OPS

__all__ = ["Collectives", "LocalCollectives"]


class Collectives(abc.ABC):
    """allreduce, broadcast, allgather and barrier over the ranks of an initialised backend.

    ``collective_count`` is the number of checked collectives this rank has started.
    """

    collective_count = 0

    def allreduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """Reduce `tensor` over all ranks with `op` (sum, mean, min, max); input is unchanged."""
        self._check_tensor(tensor, "allreduce")
        self._check_allreduce_op(tensor, op)
        with self._guard("allreduce", tensor, carry=True, op=op) as carried:
            if carried is not None:
                return _reduce(carried, op).to(tensor.device)
            return self._allreduce(tensor.detach().clone(), op)

    def allreduce_(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce `tensor` over all ranks with `op`, in place (no copy); returns `tensor`."""
        self._check_tensor(tensor, "allreduce")
        self._check_allreduce_op(tensor, op)
        with self._guard("allreduce", tensor, carry=True, op=op) as carried:
            result = _reduce(carried, op) if carried is not None else self._allreduce(tensor.detach(), op)
        if result.data_ptr() != tensor.data_ptr():
            tensor.detach().copy_(result)
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Return rank `src`'s `tensor` on every rank; input is unchanged."""
        self._check_tensor(tensor, "broadcast")
        if not 0 <= src < self.world_size:
            raise ConfigurationError(f"broadcast src={src} is outside ranks 0..{self.world_size - 1}.")
        with self._guard("broadcast", tensor, carry=True, src=src) as carried:
            if carried is not None:
                return carried[src].to(tensor.device)
            return self._broadcast(tensor.detach().clone(), src)

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite `tensor` with rank `src`'s, in place (no copy); returns `tensor`."""
        self._check_tensor(tensor, "broadcast")
        if not 0 <= src < self.world_size:
            raise ConfigurationError(f"broadcast src={src} is outside ranks 0..{self.world_size - 1}.")
        with self._guard("broadcast", tensor, carry=True, src=src) as carried:
            result = carried[src] if carried is not None else self._broadcast(tensor.detach(), src)
        if result.data_ptr() != tensor.data_ptr():
            tensor.detach().copy_(result)
        return tensor

    def allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Return every rank's `tensor` (same shape on all ranks), indexed by rank."""
        self._check_tensor(tensor, "allgather")
        with self._guard("allgather", tensor, carry=True) as carried:
            if carried is not None:
                return [t.to(tensor.device) for t in carried]
            return self._allgather(tensor.detach().contiguous())

    def barrier(self) -> None:
        """Wait until every rank reaches this call."""
        self._env()
        with self._guard("barrier"):
            self._barrier()

    @contextlib.contextmanager
    def _guard(
        self, collective: str, tensor: Optional[torch.Tensor] = None, carry: bool = False, **arguments: Any
    ) -> Iterator[Optional[list]]:
        """Around one collective: all ranks must agree on it (paraflow.reliability.collective_check), and
        communication failures leave as paraflow errors (paraflow.reliability.translation).

        Yields every rank's `tensor` when `carry` and the check carried it (small tensors), else None.
        """
        with collective_errors(self, collective):
            carried = None
            if self.world_size > 1:
                self.collective_count += 1
                carried = check_collective(
                    self, self._allgather, self.collective_count, collective, tensor, carry=carry, **arguments
                )
            yield carried

    # ---------------------------------------------------------------- for subclasses
    @abc.abstractmethod
    def _allreduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        """Reduce the private copy `tensor` in place or not, and return the result."""

    @abc.abstractmethod
    def _broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Broadcast the private copy `tensor` from `src` and return it."""

    @abc.abstractmethod
    def _allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Gather `tensor` from every rank."""

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
        self._env()


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
