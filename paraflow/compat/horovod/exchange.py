"""Horovod's allgather, broadcast, alltoall, reducescatter, join and barrier over torch.distributed.

Horovod's allgather and alltoall take tensors whose first dimension differs by rank; torch's take
equal ones, so the shapes (or row counts) are exchanged first and the rows padded or split to fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch
import torch.distributed as dist

from ...errors import ConfigurationError
from . import runtime
from .ops import (
    OP_NAMES,
    Average,
    Sum,
    _handle,
    _on_comm_device,
    _op,
    _process_set,
    _size,
    _tensor,
    allreduce,
    communicating,
    global_process_set,
    synchronize,
)

__all__ = [
    "allgather", "allgather_async", "grouped_allgather", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "alltoall", "reducescatter", "grouped_reducescatter", "join", "barrier",
]  # fmt: skip

_MAX_DIMS = 16


def allgather_async(tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = global_process_set) -> int:
    """Start gathering every rank's `tensor` along the first dimension, which may differ by rank."""
    what = "hvd.allgather"
    _tensor(tensor, what)
    _process_set(process_set, what)
    if _size() == 1:
        result = tensor.detach().clone()
        return _handle([], lambda: result, what)
    shapes = _shapes_of_every_rank(tensor, what)
    longest = max(shape[0] for shape in shapes)
    padded = tensor.detach().new_zeros((longest, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor.detach()
    padded = _on_comm_device(padded)
    out = [torch.empty_like(padded) for _ in shapes]
    with communicating(what):
        work = dist.all_gather(out, padded, async_op=True)
    return _handle([work], lambda: torch.cat([o[: s[0]] for o, s in zip(out, shapes)]).to(tensor.device), what)


def _shapes_of_every_rank(tensor: torch.Tensor, what: str) -> list:
    """Every rank's shape (one small allgather); the same error on every rank if they cannot be joined."""
    if tensor.dim() == 0 or tensor.dim() > _MAX_DIMS:
        raise ConfigurationError(
            f"{what} needs a tensor of 1 to {_MAX_DIMS} dimensions, got shape {list(tensor.shape)}."
        )
    mine = torch.full((_MAX_DIMS + 2,), -1, dtype=torch.int64)
    mine[0], mine[1] = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else len(_DTYPES), tensor.dim()
    mine[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape)
    out = [torch.empty_like(m) for m in [_on_comm_device(mine)] * _size()]
    with communicating(what):
        dist.all_gather(out, _on_comm_device(mine))
    rows = [o.tolist() for o in out]
    if len({(r[0], r[1], *r[3:]) for r in rows}) > 1:
        described = "; ".join(
            f"rank {i}: {_DTYPES[r[0]] if r[0] < len(_DTYPES) else '?'} {r[2 : 2 + r[1]]}" for i, r in enumerate(rows)
        )
        raise ConfigurationError(
            f"{what}: the ranks' tensors differ in more than their first dimension ({described}); "
            "only the first dimension may differ."
        )
    return [r[2 : 2 + r[1]] for r in rows]


_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]


def allgather(tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = global_process_set) -> torch.Tensor:
    """Every rank's `tensor` concatenated along the first dimension, in rank order (its size may differ by rank).

    Differentiable, as Horovod's: this rank's rows of the gradient, averaged over the ranks.
    """
    if _differentiable(tensor):
        _process_set(process_set, "hvd.allgather")
        return _Allgather.apply(tensor)
    return synchronize(allgather_async(tensor, name, process_set))


def _differentiable(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled()


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor):
        ctx.rows = tensor.shape[0] if tensor.dim() else 0
        return synchronize(allgather_async(tensor))

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad.contiguous(), op=Average)
        rows = allgather(torch.tensor([ctx.rows]))
        start = int(rows[: runtime.backend().rank].sum())
        return reduced.narrow(0, start, ctx.rows)


def grouped_allgather(tensors: Sequence[torch.Tensor], name=None, process_set: Any = global_process_set) -> list:
    """``allgather`` of each of `tensors`."""
    return [allgather(t, name, process_set) for t in tensors]


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set: Any = global_process_set
) -> int:
    """Start overwriting `tensor` with rank `root_rank`'s."""
    what = "hvd.broadcast"
    _tensor(tensor, what)
    _process_set(process_set, what)
    if not 0 <= root_rank < _size():
        raise ConfigurationError(f"{what}: root_rank={root_rank} is outside ranks 0..{_size() - 1}.")
    if _size() == 1:
        return _handle([], lambda: tensor, what)
    target = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
    work = _on_comm_device(target)
    with communicating(what):
        started = dist.broadcast(work, src=root_rank, async_op=True)

    def finish() -> torch.Tensor:
        if work is not target:
            target.copy_(work)
        return tensor

    return _handle([started], finish, what)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name=None, process_set: Any = global_process_set) -> int:
    """Start broadcasting rank `root_rank`'s `tensor` into a new tensor."""
    return broadcast_async_(_tensor(tensor, "hvd.broadcast").detach().clone(), root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name=None, process_set: Any = global_process_set) -> torch.Tensor:
    """Overwrite `tensor` with rank `root_rank`'s; returns `tensor`."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast(tensor: torch.Tensor, root_rank: int, name=None, process_set: Any = global_process_set) -> torch.Tensor:
    """Rank `root_rank`'s `tensor`, in a new tensor on every rank.

    Differentiable, as Horovod's: the root gets the gradient averaged over the ranks, the others zero.
    """
    if _differentiable(tensor):
        _process_set(process_set, "hvd.broadcast")
        return _Broadcast.apply(tensor, root_rank)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank):
        ctx.root_rank = root_rank
        return synchronize(broadcast_async(tensor, root_rank))

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad.contiguous(), op=Average)
        return (reduced if runtime.backend().rank == ctx.root_rank else reduced * 0), None


def alltoall(tensor: torch.Tensor, splits: Any = None, name=None, process_set: Any = global_process_set) -> Any:
    """Send rows of `tensor` to each rank (``splits[r]`` rows to rank r; default: equal parts) and
    return the rows received, in rank order; with `splits` given, also how many came from each rank.

    Differentiable, as Horovod's: the gradient's rows go back where they came from.
    """
    what = "hvd.alltoall"
    _tensor(tensor, what)
    _process_set(process_set, what)
    sending, received = _splits(tensor, splits, _size(), what), {}
    if _differentiable(tensor):
        output = _Alltoall.apply(tensor, sending, received)
    else:
        output, received["rows"] = _exchange_rows(tensor.detach(), sending)
    return output if splits is None else (output, received["rows"].to(torch.int32))


def _exchange_rows(tensor: torch.Tensor, sending: torch.Tensor) -> tuple:
    """(the rows the ranks sent here, how many came from each), `sending[r]` rows of `tensor` going to rank r."""
    if _size() == 1:
        return tensor.clone(), sending.clone()
    received = _on_comm_device(torch.empty_like(sending))
    source = _on_comm_device(tensor)
    with communicating("hvd.alltoall"):
        dist.all_to_all_single(received, _on_comm_device(sending))
        rows = received.cpu()
        output = source.new_empty((int(rows.sum()), *tensor.shape[1:]))
        dist.all_to_all_single(output, source, rows.tolist(), sending.tolist())
    return output.to(tensor.device), rows


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, sending, received):
        output, received["rows"] = _exchange_rows(tensor.detach(), sending)
        ctx.received = received["rows"]
        return output

    @staticmethod
    def backward(ctx, grad):
        return _exchange_rows(grad.contiguous(), ctx.received)[0], None, None


def _splits(tensor: torch.Tensor, splits: Any, size: int, what: str) -> torch.Tensor:
    rows = tensor.shape[0] if tensor.dim() else 0
    if splits is None:
        if rows % size:
            raise ConfigurationError(
                f"{what}: {rows} rows do not split equally over {size} ranks; pass splits= (rows for each rank)."
            )
        return torch.full((size,), rows // size, dtype=torch.int64)
    counts = torch.as_tensor(splits, dtype=torch.int64).flatten().cpu()
    if counts.numel() != size or int(counts.sum()) != rows or bool((counts < 0).any()):
        raise ConfigurationError(
            f"{what}: splits={counts.tolist()} must give one count per rank ({size}) summing to the {rows} rows."
        )
    return counts


def reducescatter(
    tensor: torch.Tensor,
    name=None,
    compression: Any = None,
    op: int = Average,
    process_set: Any = global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
) -> torch.Tensor:
    """This rank's part of the reduction of `tensor` (default: the average): the rows are shared out
    in rank order, the first ``rows % size`` ranks taking one more."""
    what = "hvd.reducescatter"
    _tensor(tensor, what)
    if _op(None, op, what) not in (Average, Sum):
        raise ConfigurationError(f"{what}: op must be hvd.Average or hvd.Sum, as in Horovod, got {OP_NAMES[op]}.")
    _process_set(process_set, what)
    return _Reducescatter.apply(tensor, compression, op, prescale_factor, postscale_factor)


class _Reducescatter(torch.autograd.Function):
    """Differentiable as Horovod's: the gradient is every rank's gathered, times size under Sum
    and times both scale factors."""

    @staticmethod
    def forward(ctx, tensor, compression, op, prescale, postscale):
        ctx.scale = (_size() if op == Sum else 1) * prescale * postscale
        reduced = allreduce(tensor.detach(), None, None, compression, op, prescale, postscale)
        size, rank = _size(), runtime.backend().rank
        base, extra = divmod(tensor.shape[0], size)
        start = rank * base + min(rank, extra)
        return reduced[start : start + base + (rank < extra)].clone()

    @staticmethod
    def backward(ctx, grad):
        return allgather(grad.contiguous() * ctx.scale), None, None, None, None


def grouped_reducescatter(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> list:
    """``reducescatter`` of each of `tensors`, with its arguments."""
    return [reducescatter(t, *args, **kwargs) for t in tensors]


# ---------------------------------------------------------------- join, barrier
def join(device: int = -1) -> int:
    """Wait until every rank has joined; returns the last rank (here the highest, as all join together).

    Horovod lets ranks that joined early take part in the others' allreduces with zeros; torch has
    no such thing, so here every rank must have made the same collectives before ``join``: give
    every rank as many batches (``DistributedSampler(drop_last=True)``).
    """
    backend = runtime.backend()
    backend.barrier()
    return backend.world_size - 1


def barrier(process_set: Any = global_process_set) -> None:
    """Wait until every rank reaches this call."""
    _process_set(process_set, "hvd.barrier")
    runtime.backend().barrier()
