"""The baseline: one process, the model as it is, no wrapper and no communication."""

from __future__ import annotations

from torch import nn

from ..core.backend import Backend
from ..core.collectives import LocalCollectives

__all__ = ["SingleProcessBackend"]


class SingleProcessBackend(LocalCollectives, Backend):
    """One process training the whole batch; what every other backend is measured against."""

    MULTI_PROCESS = False
    LAUNCHERS = ("python",)

    def _init(self) -> None:
        pass

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Move `model` to the device; nothing else."""
        return model.to(self.device)
