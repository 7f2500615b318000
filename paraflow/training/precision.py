"""Mixed precision: one `precision` option mapped to torch.autocast and a gradient scaler."""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional

import torch

from ..errors import ConfigurationError

__all__ = [
    "PRECISIONS",
    "HALF_DTYPES",
    "check_precision",
    "check_precision_on",
    "autocast",
    "GradScaler",
    "unscale_once",
]

#: "fp32": no autocast; "bf16": autocast to bfloat16; "fp16": autocast to float16 with loss scaling.
PRECISIONS = ("fp32", "bf16", "fp16")

#: The 16-bit torch dtype each reduced `precision` computes in and each `compression` sends in.
HALF_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str) -> str:
    """Return `precision` if it is one of PRECISIONS, else raise ConfigurationError."""
    if precision not in PRECISIONS:
        raise ConfigurationError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}.")
    return precision


def check_precision_on(precision: str, device: torch.device) -> None:
    """Raise ConfigurationError when `device` cannot run `precision`."""
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigurationError(
            f"precision 'bf16' needs a GPU with bfloat16 support; {torch.cuda.get_device_name(device)} "
            "has none. Use --precision fp16 (with loss scaling) or fp32."
        )


def autocast(precision: str, device: torch.device) -> ContextManager:
    """torch.autocast to `precision`'s dtype on `device`'s type; a no-op for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=HALF_DTYPES[precision])


class GradScaler(torch.amp.GradScaler):
    """torch's GradScaler, also correct for optimizers that may reduce gradients in ``step``.

    Horovod's DistributedOptimizer finishes a gradient allreduce still pending inside ``step()``,
    after the scaler would have looked for inf/NaN and unscaled (under paraflow the end of
    ``backward()`` has finished it already). This scaler calls the optimizer's ``synchronize()``
    before unscaling and steps it under ``skip_synchronize()``, the order Horovod documents.
    Other optimizers see plain torch behaviour.
    """

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Finish the optimizer's pending gradient reduction, if it has one, then unscale."""
        if self.is_enabled() and hasattr(optimizer, "synchronize"):
            optimizer.synchronize()
        super().unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Optional[float]:
        """Unscale (after the reduction), skip the step on inf/NaN, else step the optimizer."""
        if not self.is_enabled() or not hasattr(optimizer, "skip_synchronize"):
            return super().step(optimizer, *args, **kwargs)
        with optimizer.skip_synchronize():  # torch's step calls our unscale_, which reduced
            return super().step(optimizer, *args, **kwargs)


def unscale_once(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
    """``scaler.unscale_(optimizer)`` unless it ran since the last ``update()`` or nothing was scaled yet."""
    from torch.amp.grad_scaler import OptState

    if not scaler.is_enabled() or getattr(scaler, "_scale", None) is None:
        return
    if scaler._per_optimizer_states[id(optimizer)]["stage"] is OptState.READY:
        scaler.unscale_(optimizer)
