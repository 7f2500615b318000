"""Training set up by hand against raw torch DDP and raw Horovod, with no paraflow.

This is the reference the abstraction overhead is measured against: process group, wrapper and
optimizer follow the libraries' own tutorials, and nothing here imports paraflow. The step itself
(train_loop.make_step: forward, backward, optimizer step, plain torch) is shared with the
paraflow side, so the two differ only in what built the model and the optimizer.
"""

from __future__ import annotations

import os

import torch

__all__ = ["RawDDP", "RawHorovod", "RAW_LOOPS"]


class RawDDP:
    """torch.distributed + DistributedDataParallel as torchrun's documentation sets them up."""

    library = "torch DistributedDataParallel"

    def __init__(self, transport: str) -> None:
        self.transport = transport

    def init(self) -> None:
        """init_process_group from torchrun's variables; NCCL pins cuda:LOCAL_RANK first."""
        import torch.distributed as dist

        if self.transport == "nccl":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(self.transport, init_method="env://")

    def wrap(self, module: torch.nn.Module, device: torch.device, lr: float):
        """DDP around the module on `device`, plain SGD."""
        from torch.nn.parallel import DistributedDataParallel

        module = module.to(device)
        model = DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)
        return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def shutdown(self) -> None:
        """Destroy the process group."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


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


#: Backend name -> factory of its hand-written counterpart.
RAW_LOOPS = {
    "ddp-gloo": lambda: RawDDP("gloo"),
    "ddp-nccl": lambda: RawDDP("nccl"),
    "horovod": RawHorovod,
}
