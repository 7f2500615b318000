"""Gradient clipping on the synchronised gradient, with one total norm on every backend.

The total norm is summed in float64 from each gradient's own norm: a rank holding shards (FSDP)
sums its shards' powers and the ranks add theirs up, a rank holding whole gradients sums them
all. The float64 sums differ between those orders only in round-off far below float32's, so
the float32 norm, the clipping coefficient and the clipped gradients come out the same, bit for
bit, on one process, under DDP, horovod and FSDP.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from ..errors import ConfigurationError

__all__ = ["check_norm_type", "local_gradient", "norm_power", "total_norm", "clip_by_norm_"]


def check_norm_type(norm_type: Any) -> float:
    """`norm_type` as a float: a positive number or ``inf``; ConfigurationError otherwise."""
    try:
        value = float(norm_type)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0:
        raise ConfigurationError(f"norm_type must be a positive number or float('inf'), got {norm_type!r}.")
    return value


def local_gradient(grad: torch.Tensor) -> torch.Tensor:
    """The part of `grad` this process holds: its shard for a DTensor, else `grad` itself."""
    to_local = getattr(grad, "to_local", None)
    return to_local() if to_local is not None else grad


def norm_power(grads: Iterable[torch.Tensor], norm_type: float, device: torch.device) -> torch.Tensor:
    """Σ ‖g‖ᵖ over `grads` in float64 (their largest absolute entry for ``inf``), on `device`."""
    norms = [torch.linalg.vector_norm(g, norm_type, dtype=torch.float64).to(device) for g in grads]
    if not norms:
        return torch.zeros((), dtype=torch.float64, device=device)
    stacked = torch.stack(norms)
    return stacked.max() if math.isinf(norm_type) else stacked.pow(norm_type).sum()


def total_norm(power: torch.Tensor, norm_type: float, dtype: torch.dtype) -> torch.Tensor:
    """The total norm from the summed power of :func:`norm_power`, in `dtype`."""
    norm = power if math.isinf(norm_type) else power.pow(1.0 / norm_type)
    return norm.to(dtype)


def clip_by_norm_(grads: list, max_norm: float, total: torch.Tensor) -> None:
    """Scale `grads` in place by ``max_norm / (total + 1e-6)`` where that is below 1 (torch's rule)."""
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for grad in grads:
        grad.mul_(coefficient.to(grad.device))
