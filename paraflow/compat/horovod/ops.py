"""Horovod's allreduces over the backend's torch.distributed process group, and their handles.

Each asynchronous call starts torch's own asynchronous collective and returns a handle for
``poll`` and ``synchronize``; the synchronous calls are the asynchronous ones waited on. The
arithmetic is Horovod's on the CPU: ``Average`` sums, then multiplies by ``postscale_factor /
size`` (integers: the product truncated, as Horovod does), and ``prescale_factor`` multiplies
before the sum. Horovod's fusion and response cache have no counterpart: torch sends each tensor
as it is given. Process sets other than the global one, and Adasum, are Horovod's alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Callable, ContextManager, Optional

import torch
import torch.distributed as dist

from ...errors import ConfigurationError
from ...reliability.translation import collective_errors
from . import runtime

__all__ = [
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "global_process_set", "poll", "synchronize",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
]  # fmt: skip

# Horovod's values, so that either module's constants mean the same to both.
Average, Sum, Adasum, Min, Max, Product = range(6)
OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}
_TORCH_OPS = {Average: "SUM", Sum: "SUM", Min: "MIN", Max: "MAX", Product: "PRODUCT"}


class _GlobalProcessSet:
    """Horovod's ``global_process_set``: every rank (the only process set here)."""

    process_set_id = 0

    def size(self) -> int:
        return runtime.backend().world_size

    def rank(self) -> int:
        return runtime.backend().rank

    def included(self) -> bool:
        return True

    @property
    def ranks(self) -> list:
        return list(range(self.size()))

    def __repr__(self) -> str:
        return "global_process_set"


global_process_set = _GlobalProcessSet()


# ---------------------------------------------------------------- handles
class _Pending:
    """torch's Work objects of one Horovod call, what turns them into its result, and the call's name."""

    __slots__ = ("works", "finish", "what")

    def __init__(self, works: list, finish: Callable[[], Any], what: str) -> None:
        self.works, self.finish, self.what = works, finish, what


_handles: dict = {}
_numbers = itertools.count(1)


def _handle(works: list, finish: Callable[[], Any], what: str) -> int:
    number = next(_numbers)
    _handles[number] = _Pending(works, finish, what)
    return number


def communicating(what: str) -> ContextManager:
    """Context around torch's calls for `what`: a failure (a lost rank, a timeout) leaves as a
    paraflow error naming the call and this rank."""
    return collective_errors(runtime.backend(), what)


def poll(handle: int) -> bool:
    """Whether the asynchronous operation `handle` has finished (then ``synchronize`` does not wait)."""
    return all(work.is_completed() for work in _pending(handle).works)


def synchronize(handle: int) -> Any:
    """Wait for the asynchronous operation `handle` and return its result."""
    pending = _pending(handle)
    del _handles[handle]
    with communicating(pending.what):
        for work in pending.works:
            work.wait()
    return pending.finish()


def _pending(handle: Any) -> _Pending:
    if handle not in _handles:
        raise ConfigurationError(
            f"handle {handle!r} is not an operation in flight: it came from no *_async call of this process, "
            "or synchronize() already returned its result."
        )
    return _handles[handle]


# ---------------------------------------------------------------- checks and placement
def _size() -> int:
    return runtime.backend().world_size


def _op(average: Optional[bool], op: Optional[int], what: str) -> int:
    if average is not None and op is not None:
        raise ConfigurationError(f"{what}: give op= or the older average=, not both.")
    op = (Average if average in (None, True) else Sum) if op is None else op
    if op == Adasum:
        raise ConfigurationError(
            f"{what}: hvd.Adasum is Horovod's own adaptive summation, which backend {runtime.backend().name!r} "
            "cannot do; use op=hvd.Average (what DDP and FSDP do), or run on Horovod itself: "
            "paraflow run --backend horovod (its MPI controller on the CPU)."
        )
    if op not in _TORCH_OPS:
        raise ConfigurationError(f"{what}: op={op!r} is not one of hvd.Average, Sum, Min, Max, Product.")
    return op


def _process_set(process_set: Any, what: str) -> None:
    if process_set is not None and process_set is not global_process_set:
        raise ConfigurationError(
            f"{what}: Horovod process sets are not available on backend {runtime.backend().name!r}; only the "
            "global one is. Use torch.distributed.new_group() for a subgroup, or run on Horovod itself "
            "(paraflow run --backend horovod)."
        )


def _tensor(tensor: Any, what: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ConfigurationError(f"{what} takes a torch.Tensor, got {type(tensor).__name__}.")
    runtime.backend()
    return tensor


def _on_comm_device(tensor: torch.Tensor) -> torch.Tensor:
    """NCCL moves CUDA tensors only: a CPU tensor travels through this rank's GPU."""
    backend = runtime.backend()
    if backend.transport == "nccl" and tensor.device.type != "cuda":
        return tensor.to(backend.device)
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _scale(tensor: torch.Tensor, factor: float) -> None:
    if factor == 1.0:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.mul_(factor)
    else:  # Horovod scales integers in double precision and truncates
        tensor.copy_((tensor.double() * factor).trunc())


# ---------------------------------------------------------------- allreduce
def allreduce_async_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:
    """Start reducing `tensor` in place over all ranks; returns a handle for ``synchronize``."""
    what = "hvd.allreduce"
    _tensor(tensor, what)
    op = _op(average, op, what)
    _process_set(process_set, what)
    with communicating(what):
        return _handle(*_start_allreduce(tensor, op, prescale_factor, postscale_factor), what)


def _start_allreduce(tensor: torch.Tensor, op: int, prescale: float, postscale: float) -> tuple:
    """torch's asynchronous allreduce of `tensor` in place, and its finish (Horovod's scaling)."""
    size = _size()
    _scale(tensor, prescale)
    work = _on_comm_device(tensor)
    works = [dist.all_reduce(work, op=getattr(dist.ReduceOp, _TORCH_OPS[op]), async_op=True)] if size > 1 else []

    def finish() -> torch.Tensor:
        if work is not tensor:
            tensor.copy_(work)
        _scale(tensor, postscale / size if op == Average else postscale)
        return tensor

    return works, finish


def allreduce_(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Reduce `tensor` in place over all ranks (default: the average); returns `tensor`.
    Takes the arguments of ``allreduce_async_``."""
    return synchronize(allreduce_async_(tensor, *args, **kwargs))


def allreduce_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """Start reducing a copy of `tensor`; ``synchronize`` returns the result. Takes the arguments
    of ``allreduce_async_``."""
    return allreduce_async_(_tensor(tensor, "hvd.allreduce").detach().clone(), *args, **kwargs)


def allreduce(
    tensor: torch.Tensor,
    average=None,
    name=None,
    compression: Any = None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """The reduction of `tensor` over all ranks (default: the average), in a new tensor.

    Differentiable, as Horovod's: the gradient is reduced the same way on the way back.
    `compression` (``hvd.Compression.fp16``) sends the tensor in that dtype.
    """
    _tensor(tensor, "hvd.allreduce")
    op = _op(average, op, "hvd.allreduce")
    _process_set(process_set, "hvd.allreduce")
    return _Allreduce.apply(tensor, compression, op, prescale_factor, postscale_factor)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, compression, op, prescale, postscale):
        ctx.args = (compression, op, prescale, postscale)
        compressed, state = _compress(compression, tensor.detach().clone())
        with communicating("hvd.allreduce"):
            works, finish = _start_allreduce(compressed, op, prescale, postscale)
            for work in works:
                work.wait()
        return _decompress(compression, finish(), state)

    @staticmethod
    def backward(ctx, grad):
        return _Allreduce.apply(grad.contiguous(), *ctx.args), None, None, None, None


def _compress(compression: Any, tensor: torch.Tensor) -> tuple:
    return (tensor, None) if compression is None else compression.compress(tensor)


def _decompress(compression: Any, tensor: torch.Tensor, state: Any) -> torch.Tensor:
    return tensor if compression is None else compression.decompress(tensor, state)


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set: Any = global_process_set,
) -> int:
    """Start reducing each of `tensors` in place; ``synchronize`` returns them as a list."""
    what = "hvd.grouped_allreduce"
    op = _op(average, op, what)
    _process_set(process_set, what)
    with communicating(what):
        started = [_start_allreduce(_tensor(t, what), op, prescale_factor, postscale_factor) for t in tensors]
    return _handle([w for works, _ in started for w in works], lambda: [finish() for _, finish in started], what)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> int:
    """Start reducing copies of `tensors`; ``synchronize`` returns the results as a list. Takes
    the arguments of ``grouped_allreduce_async_``."""
    copies = [_tensor(t, "hvd.grouped_allreduce").detach().clone() for t in tensors]
    return grouped_allreduce_async_(copies, *args, **kwargs)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> list:
    """Reduce each of `tensors` in place; returns them. Takes the arguments of ``grouped_allreduce_async_``."""
    return synchronize(grouped_allreduce_async_(tensors, *args, **kwargs))


def grouped_allreduce(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> list:
    """The reductions of `tensors`, as new tensors. Takes the arguments of ``allreduce``."""
    return [allreduce(t, *args, **kwargs) for t in tensors]
