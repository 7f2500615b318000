"""An optimizer built before sharding, rebuilt over the sharded parameters.

``fully_shard`` replaces every parameter of the model with a new DTensor parameter. An optimizer
built before keeps the old tensors: it would step them, not the model, and training would
silently update nothing. :func:`rebuild_optimizer` builds one of the same class with the same
param groups and hyperparameters over the new parameters, or refuses with the fix.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import nn

from ...errors import ConfigurationError

__all__ = ["remember_parameters", "model_of", "rebuild_optimizer"]

_FIX = "build it after wrap_model instead: optimizer = {cls}(model.parameters(), ...) with the wrapped model"
_HOOKS = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")


def remember_parameters(model: nn.Module) -> dict:
    """Before sharding: id of each parameter -> (weak reference, its name, weak reference to `model`)."""
    return {id(p): (weakref.ref(p), name, weakref.ref(model)) for name, p in model.named_parameters()}


def model_of(optimizer: torch.optim.Optimizer, originals: Mapping[int, tuple]) -> Optional[nn.Module]:
    """The one sharded model whose former parameters `optimizer` holds, or None."""
    models = []
    for p in (p for group in optimizer.param_groups for p in group["params"]):
        entry = originals.get(id(p))
        model = entry[2]() if entry is not None and entry[0]() is p else None
        if model is None:
            return None
        models.append(model)
    return models[0] if models and all(m is models[0] for m in models) else None


def _name_of(param: torch.Tensor, originals: Mapping[int, tuple], model: nn.Module) -> Any:
    """`param`'s name in `model` before sharding, or None if it was not one of `model`'s."""
    entry = originals.get(id(param))
    if entry is None or entry[0]() is not param or entry[2]() is not model:  # ids are reused
        return None
    return entry[1]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def rebuild_optimizer(optimizer: torch.optim.Optimizer, model: nn.Module, originals: Mapping[int, tuple]):
    """`optimizer` itself if it already holds `model`'s sharded parameters, else a rebuilt one.

    Args:
        optimizer: the user's optimizer.
        model: the model returned by ``wrap_model``.
        originals: :func:`remember_parameters` of the model before it was sharded.

    Raises:
        ConfigurationError: the optimizer cannot be rebuilt faithfully (it has state, hooks, a
            scheduler attached, parameters from elsewhere, or a constructor that does not take
            its own param groups and defaults); the message says to build it after wrap_model.
    """
    cls = type(optimizer).__name__
    fix = _FIX.format(cls=cls)
    current = dict(model.named_parameters())
    current_ids = {id(p) for p in current.values()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if all(id(p) in current_ids for p in params):
        return optimizer
    strangers = [i for i, p in enumerate(params) if id(p) not in current_ids and _name_of(p, originals, model) is None]
    if strangers:
        raise ConfigurationError(
            f"the {cls} holds {len(strangers)} parameter(s) that are not the model's (positions "
            f"{strangers[:5]} in its param groups); pass the model they belong to, or {fix}."
        )
    if optimizer.state:
        raise ConfigurationError(
            f"the {cls} was built before wrap_model and already has state (it stepped, or loaded a "
            f"state dict), which belongs to the unsharded parameters; {fix}, and restore state with "
            "backend.load after wrapping."
        )
    if "step" in vars(optimizer) or any(getattr(optimizer, hooks, None) for hooks in _HOOKS):
        raise ConfigurationError(
            f"the {cls} has a learning-rate scheduler or step hooks attached, which would keep "
            f"acting on the unsharded parameters; {fix}, and attach schedulers and hooks to the "
            "optimizer wrap_optimizer returns."
        )
    groups = []
    for group in optimizer.param_groups:
        rebuilt = {k: v for k, v in group.items() if k != "params"}
        rebuilt["params"] = [
            p if id(p) in current_ids else current[_name_of(p, originals, model)] for p in group["params"]
        ]
        groups.append(rebuilt)
    try:
        new = type(optimizer)(groups, **_constructor_defaults(optimizer))
    except Exception as exc:
        raise ConfigurationError(
            f"cannot rebuild the {cls} over the sharded parameters ({type(exc).__name__}: {exc}); {fix}."
        ) from exc
    pairs = [
        (f"param group {i}", old, fresh) for i, (old, fresh) in enumerate(zip(optimizer.param_groups, new.param_groups))
    ]
    for where, old, fresh in [*pairs, ("defaults", optimizer.defaults, new.defaults)]:
        changed = [k for k in {*old, *fresh} if k != "params" and not _same(old.get(k), fresh.get(k))]
        if changed or len(optimizer.param_groups) != len(new.param_groups):
            raise ConfigurationError(
                f"rebuilding the {cls} changed its {where} ({', '.join(sorted(changed)) or 'group count'}); {fix}."
            )
    return new


def _constructor_defaults(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's defaults its constructor takes as keywords (AdamW sets some itself)."""
    try:
        parameters = inspect.signature(type(optimizer).__init__).parameters
    except (TypeError, ValueError):
        return dict(optimizer.defaults)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in parameters}
