"""torch.distributed's collectives called straight, with no paraflow: what the benchmark's sweep
times (paraflow.bench.rank.sweep), and benchmarks/collective_cost.py sets paraflow's public calls
against, on the process group paraflow started for the launch; DDP and FSDP share it."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["RawDDP"]


class RawDDP:
    """nccl-tests' collectives straight on torch.distributed (nothing else in the call)."""

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
