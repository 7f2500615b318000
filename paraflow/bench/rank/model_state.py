"""Bytes of model state one rank holds: parameters, gradients and optimizer state.

Counted from the tensors themselves, not from the process's memory: a replicating backend
(DDP, horovod) holds the whole of each, a sharding one (fsdp) only its DTensor shards, so the
ratio between them is what sharding saves, free of the runtime's own memory. Buffers, gradient
buckets and parameters gathered for the duration of a forward are not model state held between
steps and are left out.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["model_state_bytes", "local_bytes"]


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes of `tensor` stored on this rank: a DTensor's local shard, else the whole tensor."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _total(tensors: Iterable) -> int:
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            total += local_bytes(t)
    return total


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """{"parameters", "gradients", "optimizer"}: bytes this rank holds of each (see module doc).

    Parameters are the optimizer's (a sharding backend's model may have gathered ones swapped in
    between a forward and its backward), else the model's.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]] or list(model.parameters())
    return {
        "parameters": _total(params),
        "gradients": _total(p.grad for p in params),
        "optimizer": _total(value for state in optimizer.state.values() for value in state.values()),
    }
