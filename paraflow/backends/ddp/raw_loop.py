"""DDP set up by hand, as torchrun's documentation does it, with no paraflow: the reference the
benchmark's abstraction overhead is measured against (see paraflow.bench.rank.overhead), on the
process group paraflow started for the launch."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["RawDDP"]


class RawDDP:
    """torch.distributed + DistributedDataParallel as torchrun's documentation sets them up."""

    library = "torch DistributedDataParallel"

    def wrap(self, module: torch.nn.Module, device: torch.device, lr: float):
        """DDP around the module on `device`, plain SGD."""
        from torch.nn.parallel import DistributedDataParallel

        module = module.to(device)
        model = DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)
        return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    # nccl-tests' collectives straight on torch.distributed, for the benchmark's sweep (nothing
    # else in the call: it is the reference paraflow's public calls are timed against)
    def allreduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum in place."""
        dist.all_reduce(tensor)
        return tensor

    def allgather(self, tensor: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Every rank's `tensor`, concatenated into the preallocated `out`."""
        dist.all_gather_into_tensor(out, tensor)
        return out

    def reduce_scatter(self, tensor: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of the sum of every rank's `tensor`, into the preallocated `out`."""
        dist.reduce_scatter_tensor(out, tensor)
        return out

    def broadcast_(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Rank `src`'s tensor, in place."""
        dist.broadcast(tensor, src)
        return tensor
