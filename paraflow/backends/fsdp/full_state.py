"""Whole, unsharded model and optimizer states from FSDP's shards, and shards from whole states.

The whole states are exactly what the other backends save: ``model.state_dict()`` of the user's
module and ``optimizer.state_dict()`` keyed by parameter position. So a full checkpoint written
under fsdp loads under ddp, horovod or single, and theirs load under fsdp. torch's
``torch.distributed.checkpoint.state_dict`` does the gathering and sharding; it keys optimizer
state by parameter name, which is translated here to and from positions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Optional

import torch
from torch import nn

from ...errors import ConfigurationError

__all__ = [
    "is_sharded",
    "reshard",
    "keep_tuples",
    "owner_of",
    "full_model_state",
    "full_optimizer_state",
    "load_full_model_state",
    "load_full_optimizer_state",
]


def is_sharded(value: Any) -> bool:
    """Whether `value` is a module fully_shard wrapped, or an optimizer over DTensor parameters.

    A module is asked for its class, not its parameters: between a forward and the next backward
    FSDP may have swapped the unsharded tensors in.
    """
    if isinstance(value, nn.Module):
        from torch.distributed.fsdp import FSDPModule

        return isinstance(value, FSDPModule)
    if isinstance(value, torch.optim.Optimizer):
        from torch.distributed.tensor import DTensor

        return any(isinstance(p, DTensor) for group in value.param_groups for p in group["params"])
    return False


def reshard(values: Any) -> None:
    """Put the sharded parameters back into every fully_shard module among `values`.

    After a forward without backward (evaluation), FSDP leaves the root's parameters gathered
    and registered in place of the shards; saving, loading and mapping optimizer parameters to
    names all need the shards registered.
    """
    from torch.distributed.fsdp import FSDPModule

    for value in values:
        if isinstance(value, FSDPModule):
            for module in value.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()


def owner_of(optimizer: torch.optim.Optimizer, known: Optional[nn.Module], state: Mapping[str, Any]) -> nn.Module:
    """The sharded model whose parameters `optimizer` steps: the one wrap_optimizer was given,
    else the one sharded module in `state` holding them."""
    if known is not None:
        return known
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    owners = [m for m in state.values() if isinstance(m, nn.Module) and ids <= {id(p) for p in m.parameters()}]
    if len(owners) != 1:
        raise ConfigurationError(
            "cannot tell which model this optimizer steps; pass it through backend.wrap_optimizer(optimizer, "
            "model), or put that model in the same checkpoint state."
        )
    return owners[0]


def _options(**kwargs: Any):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


def _names_in_order(model: nn.Module, optimizer: torch.optim.Optimizer) -> list:
    """Each optimizer parameter's name in `model`, in the positions optimizer.state_dict() uses."""
    names = {id(p): name for name, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_model_state(model: nn.Module) -> dict:
    """The whole ``state_dict`` on rank 0, on the CPU (other ranks get an empty one); collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=True))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The whole ``optimizer.state_dict()`` (keyed by position) on rank 0; collective.

    A fresh optimizer has no tensors to gather and is returned as it is: torch's
    get_optimizer_state_dict would first create its state with a zero-gradient step, which Adam
    counts as a step, changing the rest of the run.
    """
    if not optimizer.state:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    by_name = get_optimizer_state_dict(model, optimizer, options=_options(full_state_dict=True, cpu_offload=True))
    if not by_name:
        return {}
    position = {name: i for i, name in enumerate(_names_in_order(model, optimizer))}
    return {
        "state": {position[name]: value for name, value in by_name["state"].items()},
        "param_groups": [
            {**group, "params": [position[name] for name in group["params"]]} for group in by_name["param_groups"]
        ],
    }


def load_full_model_state(model: nn.Module, state: Mapping[str, Any]) -> None:
    """Shard a whole ``state_dict`` (the same on every rank) into `model`; collective."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, dict(state), options=_options(full_state_dict=True))


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """Shard a whole ``optimizer.state_dict()`` (the same on every rank) into `optimizer`; collective."""
    if not state.get("state"):  # nothing to shard: hyperparameters only
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    names = _names_in_order(model, optimizer)
    try:
        by_name: MutableMapping[str, Any] = {
            "state": {names[int(i)]: value for i, value in state["state"].items()},
            "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]],
        }
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"its parameter positions do not match this optimizer's {len(names)} parameters") from exc
    with keep_tuples(optimizer):
        set_optimizer_state_dict(model, optimizer, by_name, options=_options(full_state_dict=True))


@contextlib.contextmanager
def keep_tuples(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Give hyperparameters back their tuple type after torch's state-dict loading made them lists.

    torch.distributed.checkpoint flattens and rebuilds state dicts, which turns Adam's ``betas``
    into a list; the optimizer works either way, but its state dict would no longer equal the
    one other backends save.
    """
    before = [{k: v for k, v in group.items() if isinstance(v, tuple)} for group in optimizer.param_groups]
    yield
    for group, tuples in zip(optimizer.param_groups, before):
        for key in tuples:
            if isinstance(group.get(key), list):
                group[key] = tuple(group[key])
