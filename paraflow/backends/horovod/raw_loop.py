"""horovod.torch set up by hand, as its PyTorch guide does it, with no paraflow: the reference the
benchmark's abstraction overhead is measured against (see paraflow.bench.rank.overhead), on the
horovod paraflow started for the launch."""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["RawHorovod"]


class RawHorovod:
    """horovod.torch as its PyTorch guide sets it up."""

    library = "horovod.torch"

    def __init__(self) -> None:
        import horovod.torch as hvd

        self._hvd = hvd  # the sweep's calls use it: no import inside a timed call

    def wrap(self, module: torch.nn.Module, device: torch.device, lr: float):
        """Broadcast the initial parameters, wrap SGD in DistributedOptimizer."""
        import horovod.torch as hvd

        module = module.to(device)
        optimizer = torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
        hvd.broadcast_parameters(module.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=module.named_parameters())
        return module, optimizer

    # nccl-tests' collectives straight on horovod.torch, for the benchmark's sweep (nothing else in
    # the call: it is the reference paraflow's public calls are timed against); named, so
    # horovod's response cache skips renegotiating each repeat (its fast path)
    def allreduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum in place."""
        return self._hvd.allreduce_(tensor, op=self._hvd.Sum, name="raw.allreduce")

    def allgather(self, tensor: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Every rank's `tensor`, concatenated (horovod allocates the output; `out` is unused)."""
        return self._hvd.allgather(tensor, name="raw.allgather")

    def reduce_scatter(self, tensor: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """This rank's chunk of the sum of every rank's `tensor` (horovod allocates it; `out` is unused)."""
        return self._hvd.reducescatter(tensor, op=self._hvd.Sum, name="raw.reducescatter")

    def broadcast_(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Rank `src`'s tensor, in place."""
        return self._hvd.broadcast_(tensor, root_rank=src, name="raw.broadcast")
