"""Picklable Python objects sent over any backend's tensor collectives."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["broadcast_object", "allgather_objects", "copy_state_from"]


def _to_bytes(obj: Any) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _from_bytes(payload: torch.Tensor) -> Any:
    return torch.load(io.BytesIO(payload.numpy().tobytes()), map_location="cpu", weights_only=False)


def broadcast_object(backend: Any, obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank (tensors inside arrive on the CPU); a collective call."""
    if backend.world_size == 1:
        return obj
    payload = _to_bytes(obj) if backend.rank == src else torch.zeros(0, dtype=torch.uint8)
    size = backend.broadcast(torch.tensor([payload.numel()], dtype=torch.int64), src=src)
    if backend.rank != src:
        payload = torch.zeros(int(size.item()), dtype=torch.uint8)
    received = backend.broadcast(payload, src=src)
    return obj if backend.rank == src else _from_bytes(received)


def allgather_objects(backend: Any, obj: Any) -> list:
    """Every rank's `obj`, indexed by rank; a collective call."""
    if backend.world_size == 1:
        return [obj]
    payload = _to_bytes(obj)
    sizes = backend.allgather(torch.tensor([payload.numel()], dtype=torch.int64))
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: payload.numel()] = payload
    gathered = backend.allgather(padded)
    return [_from_bytes(t[: int(s.item())]) for t, s in zip(gathered, sizes)]


def copy_state_from(backend: Any, objects: Sequence[Any], src: int) -> None:
    """Load rank `src`'s ``state_dict()`` of each object into the same object on every rank.

    Uneven inputs: after DDP's ``Join`` or Horovod's ``hvd.join()`` the model, and any optimizer
    or gradient scaler passed in, are copied from the last rank to finish, so every rank leaves
    the context with the same state.
    """
    for obj in objects:
        state = broadcast_object(backend, obj.state_dict() if backend.rank == src else None, src=src)
        if backend.rank != src:
            obj.load_state_dict(state)
