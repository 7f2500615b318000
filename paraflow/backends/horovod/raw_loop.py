"""horovod.torch's collectives called straight, with no paraflow: what the benchmark's sweep times
(paraflow.bench.rank.sweep), and benchmarks/collective_cost.py sets paraflow's public calls
against, on the horovod paraflow started for the launch."""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["RawHorovod"]


class RawHorovod:
    """nccl-tests' collectives straight on horovod.torch."""

    def __init__(self) -> None:
        import horovod.torch as hvd

        self._hvd = hvd  # the sweep's calls use it: no import inside a timed call

    # nothing else in the call; named, so horovod's response cache skips renegotiating each repeat
    # (its fast path)
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
