"""horovod.torch set up by hand, as its PyTorch guide does it, with no paraflow: the reference the
benchmark's abstraction overhead is measured against (see paraflow.bench.rank.overhead)."""

from __future__ import annotations

import torch

__all__ = ["RawHorovod"]


class RawHorovod:
    """horovod.torch as its PyTorch guide sets it up."""

    library = "horovod.torch"

    def init(self) -> None:
        """hvd.init()."""
        import horovod.torch as hvd

        hvd.init()

    def wrap(self, module: torch.nn.Module, device: torch.device, lr: float):
        """Broadcast the initial parameters, wrap SGD in DistributedOptimizer."""
        import horovod.torch as hvd

        module = module.to(device)
        optimizer = torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
        hvd.broadcast_parameters(module.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=module.named_parameters())
        return module, optimizer

    def shutdown(self) -> None:
        """hvd.shutdown()."""
        import horovod.torch as hvd

        hvd.shutdown()
