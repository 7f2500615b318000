"""Which submodules FSDP shards as units of their own, and its mixed-precision policy.

Each unit's parameters are all-gathered in one collective just before its forward and freed
after it, so a model cut into blocks never holds more than a block or two unsharded at once; the
root unit takes whatever parameters no block took.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Optional, Union

import torch
from torch import nn

from ...errors import ConfigurationError
from ...training.precision import HALF_DTYPES

__all__ = ["DEFAULT_MIN_BLOCK_PARAMS", "BLOCK_CLASSES", "check_blocks", "choose_blocks", "mixed_precision_policy"]

#: A submodule holding at least this many parameters no smaller block took becomes a block.
DEFAULT_MIN_BLOCK_PARAMS = 50_000
#: Module classes that are blocks wherever they appear (by default): transformer layers.
BLOCK_CLASSES = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


def check_blocks(blocks: Union[None, str, type, Iterable[Union[str, type]]]) -> Optional[tuple]:
    """`blocks` as a tuple of class names (None: choose automatically; ``()``: the root alone).

    Accepts a comma-separated string ("Linear,Conv2d"), a module class, or an iterable of names
    and classes.
    """
    if blocks is None:
        return None
    if isinstance(blocks, str):
        items: list = [b.strip() for b in blocks.split(",") if b.strip()]
    elif isinstance(blocks, type):
        items = [blocks]
    else:
        try:
            items = list(blocks)
        except TypeError:
            items = [blocks]
    names = []
    for item in items:
        if isinstance(item, type) and issubclass(item, nn.Module):
            names.append(item.__name__)
        elif isinstance(item, str) and item.isidentifier():
            names.append(item)
        else:
            raise ConfigurationError(
                f"blocks must name module classes (blocks='TransformerEncoderLayer' or blocks=[nn.Linear]), "
                f"got {item!r}."
            )
    return tuple(names)


def _post_order(module: nn.Module, seen: set) -> Iterator[nn.Module]:
    """Every submodule once, children before their parent (fully_shard goes bottom-up)."""
    for child in module.children():
        if id(child) not in seen:
            seen.add(id(child))
            yield from _post_order(child, seen)
            yield child


def choose_blocks(model: nn.Module, blocks: Optional[tuple], min_block_params: int) -> list:
    """The submodules of `model` to shard before the root, children before parents.

    Args:
        model: the user's model, not yet sharded.
        blocks: class names whose instances are blocks; None picks them automatically: every
            instance of BLOCK_CLASSES, and every submodule holding at least `min_block_params`
            parameters that no block inside it took.
        min_block_params: the size threshold of the automatic choice.

    A container without forward (ModuleList, ModuleDict) is never a block: where the automatic
    choice would take one, it takes the modules inside it instead.

    Raises:
        ConfigurationError: a class named in `blocks` does not occur in `model` (the message
            lists the classes that do), or is a container without forward.
    """
    if blocks is not None:
        present = {type(m).__name__ for m in model.modules()}
        missing = [name for name in blocks if name not in present]
        if missing:
            raise ConfigurationError(
                f"blocks names {', '.join(missing)}, not found in this {type(model).__name__}; "
                f"its module classes are: {', '.join(sorted(present))}."
            )
        containers = [m for m in model.modules() if type(m).__name__ in blocks and not _has_forward(m)]
        if containers:
            inside = sorted({type(u).__name__ for c in containers for u in _units_inside(c, set())})
            raise ConfigurationError(
                f"blocks names {', '.join(sorted({type(c).__name__ for c in containers}))}, a container without "
                f"forward; fully_shard shards modules that run forward. Name the classes inside it instead: "
                f"blocks={','.join(inside)!r}."
            )
    taken: set = set()
    chosen: list = []
    for module in _post_order(model, set()):
        free = [p for p in module.parameters() if id(p) not in taken]
        if not free:
            continue
        if blocks is not None:
            wanted = type(module).__name__ in blocks
        else:
            wanted = isinstance(module, BLOCK_CLASSES) or sum(p.numel() for p in free) >= min_block_params
        if wanted:
            units = [module] if _has_forward(module) else _units_inside(module, taken)
            chosen.extend(units)
            for unit in units:
                taken.update(id(p) for p in unit.parameters())
    return chosen


def _has_forward(module: nn.Module) -> bool:
    """Whether `module` implements forward (ModuleList and ModuleDict do not)."""
    return type(module).forward is not nn.Module.forward


def _units_inside(container: nn.Module, taken: set) -> list:
    """The modules with forward to shard in place of `container`: its children holding parameters
    no block took, looking through nested containers (nanoGPT's blocks in a ModuleList)."""
    units = []
    for child in container.children():
        if not any(id(p) not in taken for p in child.parameters()):
            continue
        units.extend([child] if _has_forward(child) else _units_inside(child, taken))
    return units


def mixed_precision_policy(precision: str, compression: str, param_dtype: torch.dtype):
    """FSDP's MixedPrecisionPolicy for paraflow's `precision` and `compression`.

    ``precision`` "bf16"/"fp16" is the dtype parameters are all-gathered and computed in (the
    sharded parameters, gradients and optimizer state keep `param_dtype`); ``compression`` is
    the dtype gradients are reduce-scattered in. Without compression gradients cross in
    `param_dtype` even when computing in 16 bits.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    compute = HALF_DTYPES.get(precision)
    reduce = HALF_DTYPES.get(compression)
    if compute is not None and reduce is None:
        reduce = param_dtype
    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=reduce)
