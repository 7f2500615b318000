"""Uneven inputs under DDP: torch's generic ``Join`` context manager over the DDP model.

Its DDP hook shadows the gradient allreduce on ranks that finished early (a finished rank counts
as a zero gradient); afterwards the optimizer, gradient scaler and other state passed in are
copied from the last rank to finish.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ...training.join import copy_state_from

if TYPE_CHECKING:
    from ...core.backend import Backend

__all__ = ["ddp_join"]


def _last_joiner_tracker(model: nn.Module):
    """A Joinable that only records whether this rank was among the last to join."""
    from torch.distributed.algorithms.join import Joinable, JoinHook

    class _Hook(JoinHook):
        def __init__(self, owner: _Tracker) -> None:
            self.owner = owner

        def post_hook(self, is_last_joiner: bool) -> None:
            self.owner.is_last_joiner = is_last_joiner

    class _Tracker(Joinable):
        def __init__(self) -> None:
            super().__init__()
            self.is_last_joiner = True

        def join_hook(self, **kwargs: Any) -> JoinHook:
            return _Hook(self)

        @property
        def join_device(self) -> torch.device:
            return model.join_device

        @property
        def join_process_group(self) -> Any:
            return model.join_process_group

    return _Tracker()


@contextlib.contextmanager
def ddp_join(backend: Backend, model: nn.Module, stateful: Sequence[Any], enable: bool = True) -> Iterator[None]:
    """torch's Join over a DDP model; then copy `stateful` objects from the last rank to finish."""
    from torch.distributed.algorithms.join import Join, Joinable

    joinables = [model] + [s for s in stateful if isinstance(s, Joinable)]
    others = [s for s in stateful if not isinstance(s, Joinable)]
    tracker = _last_joiner_tracker(model)
    with Join(joinables + [tracker], enable=enable):
        yield
    if enable and others:
        last = backend.allgather(torch.tensor([int(tracker.is_last_joiner)], dtype=torch.int64))
        flags = [int(t.item()) for t in last]
        if not all(flags):  # some rank stopped early and missed optimizer steps
            copy_state_from(backend, others, src=max(r for r, f in enumerate(flags) if f))
