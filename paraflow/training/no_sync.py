"""``no_sync`` decided at the forward, as DistributedDataParallel decides it.

DDP chooses at each forward whether the backward pass that follows reduces gradients, so the
common pattern puts only the forward inside ``no_sync``::

    with backend.no_sync(model):
        loss = model(x)
    loss.backward()          # outside the context, still not reduced

Backends whose gradient reduction is switched elsewhere (horovod's hooks on the gradient
accumulators, FSDP's gradient-sync flag) get the same meaning from :class:`ForwardDecidedSync`:
a forward with gradients inside the context turns reduction off until the next forward outside
it, and a backward run inside the context is never reduced either.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Callable, Optional

import torch
from torch import nn

__all__ = ["ForwardDecidedSync", "forward_decided_sync"]

_ATTRIBUTE = "_paraflow_no_sync"


class ForwardDecidedSync:
    """Whether the backward passes to come reduce gradients of one model, decided at its forward.

    Args:
        model: the module the training forward calls; a forward pre-hook is put on it.
        stop: turns gradient reduction off; returns whatever `resume` needs to turn it back on.
        resume: turns it back on, given what `stop` returned.
        owner: who made this state (a backend); :func:`forward_decided_sync` replaces the
            state of a model that another owner made.
    """

    def __init__(
        self, model: nn.Module, stop: Callable[[], Any], resume: Callable[[Any], None], owner: Any = None
    ) -> None:
        self.owner = owner
        self._stop: Optional[Callable[[], Any]] = stop
        self._resume: Optional[Callable[[Any], None]] = resume
        self._stopped = False
        self._token: Any = None
        self._depth = 0
        self._forward_inside = False
        self._hook = model.register_forward_pre_hook(self)

    def __call__(self, module: nn.Module, args: Any) -> None:
        """The forward pre-hook: a forward with gradients decides for the backward passes after it."""
        if not torch.is_grad_enabled():
            return  # evaluation: no backward follows
        if self._depth:
            self._forward_inside = True
            self._set(reducing=False)
        else:
            self._set(reducing=True)

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """The ``no_sync`` context: backward passes inside, and those of forwards inside, are not reduced."""
        if self._depth == 0:
            self._forward_inside = False
        self._depth += 1
        self._set(reducing=False)
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0 and not self._forward_inside:
                self._set(reducing=True)  # only backward passes ran inside: the next one reduces

    def remove(self) -> None:
        """Turn reduction back on and take the hook off the model."""
        self._set(reducing=True)
        self._hook.remove()
        self._stop = self._resume = None

    def _set(self, reducing: bool) -> None:
        if self._stop is None or self._resume is None:
            return  # removed, or a pickled copy
        if reducing and self._stopped:
            token, self._token, self._stopped = self._token, None, False
            self._resume(token)
        elif not reducing and not self._stopped:
            self._token, self._stopped = self._stop(), True

    # The hook travels with the model: a deep copy shares it, a pickled copy gets an inert one.
    def __deepcopy__(self, memo: dict) -> ForwardDecidedSync:
        return self

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_stop": None, "_resume": None, "_token": None, "_stopped": False, "owner": None}


def forward_decided_sync(
    model: nn.Module, stop: Callable[[], Any], resume: Callable[[Any], None], owner: Any
) -> ForwardDecidedSync:
    """The no_sync state `owner` keeps on `model`, made (and its forward hook put on) at the first call."""
    state = getattr(model, _ATTRIBUTE, None)
    if isinstance(state, ForwardDecidedSync) and state.owner is owner:
        return state
    if isinstance(state, ForwardDecidedSync):
        state.remove()  # left by an earlier session
    state = ForwardDecidedSync(model, stop, resume, owner)
    object.__setattr__(model, _ATTRIBUTE, state)
    return state
