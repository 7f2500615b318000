"""Reading a sharded checkpoint (fsdp's ``backend.save``) as whole tensors, on any backend.

A sharded checkpoint is a directory::

    PATH/current        the name of the committed version
    PATH/<version>/     torch.distributed.checkpoint's files and paraflow.pt

``paraflow.pt`` holds what is not sharded (RNG states, plain entries, small state dicts) and
which entries torch.distributed.checkpoint holds ("kinds": model or optimizer). Here one process
reads every shard with torch.distributed.checkpoint's own loader, with no process group, into
the entries a full checkpoint file holds: the model's ``state_dict`` and the optimizer's, keyed
by parameter position. So ddp, horovod and single resume from fsdp's checkpoint at any world
size, as fsdp resumes from theirs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import CheckpointError
from .checkpoint_reader import UnreadableCheckpoint, check_rng_states

__all__ = ["POINTER", "EXTRAS", "committed_version", "read_sharded_checkpoint", "optimizer_state_by_position"]

#: The file naming the committed version.
POINTER = "current"
#: The file in a version holding what torch.distributed.checkpoint does not.
EXTRAS = "paraflow.pt"


def committed_version(path: str) -> str:
    """The directory of `path`'s committed version; CheckpointError if there is none."""
    pointer = os.path.join(path, POINTER)
    try:
        with open(pointer) as f:
            version = f.read().strip()
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} holds no committed sharded checkpoint (no {POINTER} file): no save into it finished."
        ) from None
    return os.path.join(path, version)


def read_sharded_checkpoint(path: str, device: torch.device, rank: int, check_rng: bool) -> dict:
    """The sharded checkpoint at `path` as a full checkpoint file holds it, tensors on `device`.

    Args:
        path: the checkpoint directory fsdp's ``backend.save`` wrote.
        device: where tensors go.
        rank: this process's rank, whose saved RNG state is checked.
        check_rng: whether to check that this rank's saved RNG state can be restored.

    Raises:
        CheckpointError: no version of it was committed.
        UnreadableCheckpoint: its files are missing or damaged.
    """
    directory = committed_version(path)
    try:
        extras = torch.load(os.path.join(directory, EXTRAS), map_location=device, weights_only=True)
        kinds, state = extras["kinds"], dict(extras["state"])
        sharded = _load_whole(directory, set(kinds))
    except (OSError, KeyError, RuntimeError, ValueError) as exc:
        raise UnreadableCheckpoint(f"its committed version {directory} cannot be read: {exc}") from exc
    for key, kind in kinds.items():
        if key not in sharded:
            raise UnreadableCheckpoint(f"its committed version {directory} holds no {kind} entry {key!r}")
        whole = _to_device(sharded[key], device)
        state[key] = optimizer_state_by_position(whole) if kind == "optimizer" else whole
    if check_rng:
        check_rng_states(extras.get("rng"), rank)
    return {"paraflow": extras["paraflow"], "state": state, "rng": extras["rng"]}


def optimizer_state_by_position(by_name: Mapping[str, Any]) -> dict:
    """An optimizer state dict keyed by parameter name (torch.distributed.checkpoint's) keyed by
    position, as ``optimizer.state_dict()`` is: the names' order in the parameter groups."""
    names = [name for group in by_name["param_groups"] for name in group["params"]]
    position = {name: i for i, name in enumerate(names)}
    return {
        "state": {position[name]: value for name, value in by_name["state"].items()},
        "param_groups": [
            {**group, "params": [position[name] for name in group["params"]]} for group in by_name["param_groups"]
        ],
    }


def _load_whole(directory: str, keys: set) -> dict:
    """Every shard of the entries `keys` in `directory`, joined into whole tensors (on the CPU).

    torch.distributed.checkpoint's loader for one process, as its ``dcp_to_torch_save`` uses it:
    no process group, so any backend (or none) can call it.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    loaded: dict = {}
    _load_state_dict(
        loaded, storage_reader=FileSystemReader(directory), planner=_EmptyStateDictLoadPlanner(keys=keys), no_dist=True
    )
    return loaded


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_device(v, device) for v in value]
    return value
