"""The baseline: one process, the model as it is, no wrapper and no communication."""

from __future__ import annotations

import torch
from torch import nn

from ..core.backend import Backend
from ..core.compiling import CompileOption, compile_model, compile_options

__all__ = ["SingleProcessBackend"]


class SingleProcessBackend(Backend):
    """One process training the whole batch; what every other backend is measured against."""

    MULTI_PROCESS = False
    LAUNCHERS = ("python",)

    def _init(self) -> None:
        pass

    def wrap_model(self, model: nn.Module, compile: CompileOption = None) -> nn.Module:
        """Move `model` to the device, and with `compile`, return ``torch.compile(model, **compile)``."""
        return compile_model(model.to(self.device), compile_options(compile))

    # Collectives for a single process: every result is this process's own tensor.
    def _allreduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        return tensor

    def _broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        return tensor

    def _allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return [tensor.clone()]

    def barrier(self) -> None:
        """Nothing to wait for in one process."""
        self._live()
