"""Gradient compression: one `compression` option mapped to each library's own mechanism.

| value | DDP | Horovod |
|---|---|---|
| none | plain allreduce | ``hvd.Compression.none`` |
| fp16 | hook doing torch's ``fp16_compress_hook`` | ``hvd.Compression.fp16`` |
| bf16 | hook doing torch's ``bf16_compress_hook`` | not supported (its allreduce refuses bfloat16) |

The DDP hooks (`paraflow.comm_hooks.compress_hook`) do what torch's do, with their continuation
tracked so that the process exits safely after them, and under a name that DDP does not refuse
for bf16 over gloo (it refuses a hook named
``bf16_compress_hook`` unless NCCL >= 2.10 is present, a check meant for NCCL, while gloo reduces
bfloat16 itself).

One-process backends (single, dp) communicate no gradients, so they accept ``none`` only.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from .comm_hooks import compress_hook
from .errors import ConfigurationError

__all__ = ["COMPRESSIONS", "check_compression", "register_ddp_compression"]

COMPRESSIONS = ("none", "fp16", "bf16")


def check_compression(backend: str, compression: str, supported: Iterable[str], why: str = "") -> str:
    """Return `compression` if `backend` supports it; otherwise raise ConfigurationError naming it.

    Args:
        backend: the backend's name, for the message.
        compression: the requested value.
        supported: the values this backend can do.
        why: the reason the others are missing, appended to the message.
    """
    supported = [c for c in COMPRESSIONS if c in set(supported)]
    if compression not in COMPRESSIONS:
        raise ConfigurationError(f"compression {compression!r} is not one of {', '.join(map(repr, COMPRESSIONS))}.")
    if compression not in supported:
        raise ConfigurationError(
            f"backend {backend!r} cannot do gradient compression {compression!r}"
            f"{': ' + why if why else ''}; it supports: {', '.join(map(repr, supported))}."
        )
    return compression


def register_ddp_compression(model: nn.Module, compression: str, transport: str) -> None:
    """Register an fp16/bf16 compression communication hook on a DistributedDataParallel model.

    The hooks are torch's ``fp16_compress_hook`` / ``bf16_compress_hook`` (see
    `paraflow.comm_hooks.compress_hook`): each gradient bucket is cast to the 16-bit type, divided
    by the world size, allreduced, and cast back, so gradients cross the wire at half their size.

    Args:
        model: the DistributedDataParallel module.
        compression: "none", "fp16" or "bf16".
        transport: the process group's backend, "nccl" or "gloo" (bf16 over NCCL is checked at
            construction).
    """
    if compression == "none":
        return
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[compression]
    model.register_comm_hook(state=None, hook=compress_hook(dtype))
