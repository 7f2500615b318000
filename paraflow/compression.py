"""Gradient compression: one `compression` option mapped to each library's own mechanism.

| value | DDP | Horovod |
|---|---|---|
| none | plain allreduce | ``hvd.Compression.none`` |
| fp16 | ``default_hooks.fp16_compress_hook`` | ``hvd.Compression.fp16`` |
| bf16 | ``default_hooks.bf16_compress_hook`` | not supported (its allreduce refuses bfloat16) |

Over gloo, torch's bf16 hook is registered under another name: DDP refuses a hook named
``bf16_compress_hook`` unless NCCL >= 2.10 is present, a check meant for NCCL, while gloo reduces
bfloat16 itself.

One-process backends (single, dp) communicate no gradients, so they accept ``none`` only.
"""

from __future__ import annotations

from typing import Iterable

from torch import nn

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


def _bf16_compress_over_gloo(state, bucket):  # unannotated: DDP checks hook annotations
    """torch's ``bf16_compress_hook``, under a name DDP does not reserve for NCCL."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return default_hooks.bf16_compress_hook(state, bucket)


def register_ddp_compression(model: nn.Module, compression: str, transport: str) -> None:
    """Register torch's fp16/bf16 compression communication hook on a DistributedDataParallel model.

    The hooks cast each gradient bucket to the 16-bit type, divide by the world size, allreduce,
    and cast back, so gradients cross the wire at half their size.

    Args:
        model: the DistributedDataParallel module.
        compression: "none", "fp16" or "bf16".
        transport: the process group's backend, "nccl" or "gloo".
    """
    if compression == "none":
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    hook = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}[compression]
    if compression == "bf16" and transport != "nccl":
        hook = _bf16_compress_over_gloo
    model.register_comm_hook(state=None, hook=hook)
