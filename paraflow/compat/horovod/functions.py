"""Horovod's helpers for models, optimizers and Python objects, over the drop-in's collectives."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import torch

from ...errors import ConfigurationError
from ...training.object_collectives import allgather_objects
from ...training.object_collectives import broadcast_object as _broadcast_object
from . import exchange, ops, runtime

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object"]


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrite every rank's tensors with rank `root_rank`'s, in place.

    Args:
        params: ``model.state_dict()`` (a mapping, taken in the order of its sorted names),
            ``model.named_parameters()`` as a list, or a list of tensors.
        root_rank: the rank whose values every rank takes.
    """
    if isinstance(params, Mapping):
        tensors = [t for _, t in sorted(params.items(), key=lambda item: item[0])]
    elif isinstance(params, list):
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]
    else:
        raise ConfigurationError(
            f"hvd.broadcast_parameters takes model.state_dict() or a list such as list(model.named_parameters()), "
            f"got {type(params).__name__}."
        )
    handles = [exchange.broadcast_async_(t, root_rank) for t in tensors if isinstance(t, torch.Tensor)]
    for handle in handles:
        ops.synchronize(handle)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None) -> None:
    """Give every rank rank `root_rank`'s optimizer state and hyperparameters (learning rate, ...).

    As in Horovod, an optimizer with no state yet first takes one step with zero gradients, so that
    its state exists to be sent (Adam's step count then starts at one; parameters move only under
    weight decay).
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ConfigurationError("hvd.broadcast_optimizer_state cannot send torch.optim.LBFGS's state, as in Horovod.")
    state = optimizer.state_dict()
    if not state["state"]:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
                    if isinstance(optimizer, torch.optim.SparseAdam):
                        p.grad = p.grad.to_sparse()
        skip = getattr(optimizer, "skip_synchronize", None)
        if skip is not None:
            with skip():
                optimizer.step()
        else:
            optimizer.step()
        state = optimizer.state_dict()
    if not state["state"]:
        return  # a stateless optimizer: nothing to send
    tensors, scalars, assign = [], {}, {}
    for index, group in enumerate(state["param_groups"]):
        for key, value in group.items():
            if key != "params":
                scalars[f"{key}.{index}"] = value
                assign[f"{key}.{index}"] = (optimizer.param_groups[index], key)
        for pid in group["params"]:
            for key, value in state["state"].get(pid, {}).items():
                if isinstance(value, torch.Tensor):
                    tensors.append(value)
                else:
                    scalars[f"{key}.{pid}"] = value
                    assign[f"{key}.{pid}"] = (state["state"][pid], key)
    broadcast_parameters(tensors, root_rank)
    for key, value in broadcast_object(scalars, root_rank).items():
        where, name = assign[key]
        where[name] = value


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set: Any = None) -> Any:
    """Rank `root_rank`'s picklable `obj` on every rank (tensors inside arrive on the CPU)."""
    ops._process_set(process_set, "hvd.broadcast_object")
    backend = runtime.backend()
    if not 0 <= root_rank < backend.world_size:
        raise ConfigurationError(
            f"hvd.broadcast_object: root_rank={root_rank} is outside ranks 0..{backend.world_size - 1}."
        )
    return _broadcast_object(backend, obj, src=root_rank)


def allgather_object(obj: Any, name: Optional[str] = None) -> list:
    """Every rank's picklable `obj`, in rank order."""
    return allgather_objects(runtime.backend(), obj)
