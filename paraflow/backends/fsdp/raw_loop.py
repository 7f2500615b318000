"""FSDP2 set up by hand, as torch's fully_shard documentation does it, with no paraflow: the
reference the benchmark's abstraction overhead is measured against (paraflow.bench.rank.overhead).

It shards the same blocks paraflow's default choice would (each block, then the root), so both
sides run the same collectives and the difference is paraflow's alone. It runs on the process
group paraflow started for the launch, as raw DDP does.
"""

from __future__ import annotations

import torch

from ..ddp.raw_loop import RawDDP
from .wrap import DEFAULT_MIN_BLOCK_PARAMS, choose_blocks

__all__ = ["RawFSDP"]


class RawFSDP(RawDDP):
    """torch.distributed + fully_shard on a 1-D device mesh, plain SGD over the sharded parameters."""

    library = "torch fully_shard (FSDP2)"

    def wrap(self, module: torch.nn.Module, device: torch.device, lr: float):
        """fully_shard each block then the root on `device`; SGD built after sharding."""
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        module = module.to(device)
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for block in choose_blocks(module, None, DEFAULT_MIN_BLOCK_PARAMS):
            fully_shard(block, mesh=mesh)
        fully_shard(module, mesh=mesh)
        return module, torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
