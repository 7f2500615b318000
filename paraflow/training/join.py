"""Uneven inputs: ranks that run out of batches early keep answering the others' collectives.

DDP uses torch's generic ``Join`` context manager (``torch.distributed.algorithms.join``), whose
DDP hook shadows the gradient allreduce on finished ranks and copies the final model from the
last rank to finish. Horovod uses ``hvd.join()``, under which finished ranks contribute zeros to
the remaining allreduces. Either way an allreduce average still divides by the full world size
(a finished rank counts as a zero gradient), and afterwards the model, and any optimizer or
gradient scaler passed in, are copied from the last rank to finish, so every rank leaves the
context with the same state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .object_collectives import broadcast_object

__all__ = ["copy_state_from"]


def copy_state_from(backend: Any, objects: Sequence[Any], src: int) -> None:
    """Load rank `src`'s ``state_dict()`` of each object into the same object on every rank."""
    for obj in objects:
        state = broadcast_object(backend, obj.state_dict() if backend.rank == src else None, src=src)
        if backend.rank != src:
            obj.load_state_dict(state)
