"""Gradient compression: one `compression` option mapped to each library's own mechanism.

| value | DDP | Horovod |
|---|---|---|
| none | plain allreduce | ``hvd.Compression.none`` |
| fp16 | hook doing torch's ``fp16_compress_hook`` | ``hvd.Compression.fp16`` |
| bf16 | hook doing torch's ``bf16_compress_hook`` | not supported (its allreduce refuses bfloat16) |

The DDP hooks (`paraflow.backends.ddp.comm_hooks.compress_hook`) do what torch's do, with their continuation
tracked so that the process exits safely after them, and under a name that DDP does not refuse
for bf16 over gloo (it refuses a hook named
``bf16_compress_hook`` unless NCCL >= 2.10 is present, a check meant for NCCL, while gloo reduces
bfloat16 itself).

One-process backends (single, dp) communicate no gradients, so they accept ``none`` only.
"""

from __future__ import annotations

import torch
from torch import nn

from .comm_hooks import compress_hook

__all__ = ["register_ddp_compression"]


def register_ddp_compression(model: nn.Module, compression: str, transport: str) -> None:
    """Register an fp16/bf16 compression communication hook on a DistributedDataParallel model.

    The hooks are torch's ``fp16_compress_hook`` / ``bf16_compress_hook`` (see
    `paraflow.backends.ddp.comm_hooks.compress_hook`): each gradient bucket is cast to the 16-bit type, divided
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
