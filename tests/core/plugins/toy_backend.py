"""A backend written outside paraflow, as a user would: plain data parallelism that averages
every gradient with the public in-place allreduce in ``optimizer.step``."""

from __future__ import annotations

import torch
from torch import nn

from paraflow.backends.torch_distributed import TorchDistributedBackend


class AveragingOptimizer:
    """Wraps an optimizer: ``step`` first averages each gradient over the ranks."""

    def __init__(self, backend: ToyBackend, optimizer: torch.optim.Optimizer) -> None:
        self.backend, self.optimizer = backend, optimizer

    def step(self, closure=None):
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.backend.allreduce_(p.grad, op="mean")
        return self.optimizer.step(closure)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)


class ToyBackend(TorchDistributedBackend):
    """Every rank starts from rank 0's parameters; gradients are averaged in ``step``."""

    def wrap_model(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        for tensor in model.state_dict().values():
            tensor.copy_(self.broadcast(tensor, src=0))
        return model

    def wrap_optimizer(self, optimizer, model=None):
        return AveragingOptimizer(self, optimizer)
