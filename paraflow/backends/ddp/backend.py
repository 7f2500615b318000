"""DistributedDataParallel over NCCL or gloo, with torch.distributed collectives."""

from __future__ import annotations

import datetime
from typing import Any, ContextManager, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ...core.backend import Backend
from ...environment.rendezvous import resolve_master
from ...errors import ConfigurationError
from ...reliability.debug import debug_enabled, enable_torch_debug
from ...reliability.failures import (
    CheckedDistributedDataParallel,
    call_with_deadline,
    startup_errors,
    store_for_this_attempt,
)
from .comm_hooks import release_continuations
from .compression import register_ddp_compression

__all__ = ["DDPBackend", "DDP_OPTIONS"]

#: DistributedDataParallel keyword arguments passed through under their torch names.
DDP_OPTIONS = frozenset(
    {"bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "find_unused_parameters", "broadcast_buffers"}
)

_TORCH_OPS = {"sum": "SUM", "mean": "SUM", "min": "MIN", "max": "MAX"}


class DDPBackend(Backend):
    """torch DistributedDataParallel; one process per device, any launcher.

    Options:
        process_group: "nccl", "gloo" or "auto" (NCCL when CUDA is available, else gloo).
        bucket_cap_mb, gradient_as_bucket_view, static_graph, find_unused_parameters,
        broadcast_buffers: passed to DistributedDataParallel unchanged.

    ``compression`` "fp16" / "bf16" registers torch's fp16/bf16 compression communication hook.
    """

    OPTIONS = DDP_OPTIONS | {"process_group"}
    COMPRESSIONS = frozenset({"none", "fp16", "bf16"})

    def __init__(self, name: str, *, process_group: str = "auto", **options: Any) -> None:
        super().__init__(name, **options)
        if process_group not in ("auto", "gloo", "nccl"):
            raise ConfigurationError(f"process_group {process_group!r} is not 'auto', 'gloo' or 'nccl'.")
        self.process_group = process_group
        self.ddp_options = {k: v for k, v in self.options.items() if k in DDP_OPTIONS}
        if (
            self.compression == "bf16"
            and self.transport == "nccl"
            and not (torch.cuda.is_bf16_supported() and torch.cuda.nccl.version() >= (2, 10))
        ):
            raise ConfigurationError(
                "compression 'bf16' over NCCL needs a GPU with bfloat16 support and "
                "NCCL >= 2.10; use compression='fp16'."
            )
        self._owns_group = False

    @classmethod
    def unavailable_reason(cls, process_group: str = "auto", **_: Any) -> Optional[str]:
        """Why this process group cannot run here, or None."""
        if not dist.is_available():
            return "this torch build has no torch.distributed"
        if process_group == "nccl":
            if not torch.cuda.is_available():
                return (
                    f"NCCL needs CUDA, but torch {torch.__version__} sees no GPU; "
                    "use --backend ddp-gloo (or ddp, which picks gloo here)"
                )
            if not dist.is_nccl_available():
                return "this torch build has no NCCL; use --backend ddp-gloo"
        if process_group == "gloo" and not dist.is_gloo_available():
            return "this torch build has no gloo; use --backend ddp-nccl on a GPU host"
        return None

    def _presets(self) -> dict:
        return {"process_group": self.process_group}

    @property
    def transport(self) -> str:
        """The torch.distributed process group in use: "nccl" or "gloo"."""
        if self.process_group != "auto":
            return self.process_group
        return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"

    def _uses_cuda(self) -> bool:
        return torch.cuda.is_available() and (self.transport == "nccl" or self.requested_device == "cuda")

    def _init(self) -> None:
        if dist.is_initialized():
            if dist.get_world_size() != self.world_size:
                raise ConfigurationError(
                    f"torch.distributed is already initialised with world size {dist.get_world_size()}, "
                    f"but the launcher says {self.world_size}."
                )
            return
        env = self.env
        if env.launcher == "torchrun":
            init_method = "env://"  # torchrun's agent already holds the store at MASTER_PORT
            addr, port = env.master_addr, env.master_port
        else:
            addr, port = resolve_master(env)
            init_method = f"tcp://{addr}:{port}"
        kwargs = {"device_id": self.device} if self.device.type == "cuda" else {}
        if debug_enabled():
            enable_torch_debug()

        def start() -> None:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # the helper thread's own current device
            store = (
                store_for_this_attempt(addr, port, env.world_size, self.timeout) if env.launcher == "torchrun" else None
            )  # torchrun restarts reuse its store
            where = {"store": store} if store is not None else {"init_method": init_method}
            dist.init_process_group(
                self.transport,
                rank=env.rank,
                world_size=env.world_size,
                timeout=datetime.timedelta(seconds=self.timeout),
                **where,
                **kwargs,
            )

        with startup_errors(
            rank=env.rank,
            world_size=env.world_size,
            address=addr,
            port=port,
            timeout=self.timeout,
            launcher=env.launcher,
        ):
            # A client whose rendezvous port is held by another program waits forever otherwise.
            call_with_deadline(start, self.timeout + 10, "joining the process group")
        self._owns_group = True

    def _shutdown(self) -> None:
        release_continuations()  # a gloo thread still releasing a hook's continuation needs the GIL
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Move `model` to this rank's device and wrap it in DistributedDataParallel."""
        model = model.to(self.device)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = CheckedDistributedDataParallel(model, device_ids=device_ids, **self.ddp_options)
        wrapped.paraflow_backend_name = self.name
        register_ddp_compression(wrapped, self.compression, self.transport)
        return wrapped

    def no_sync(self, model: nn.Module) -> ContextManager:
        """DDP's own no_sync: gradients accumulate locally until a backward outside it."""
        if not isinstance(model, DistributedDataParallel):
            raise ConfigurationError("no_sync needs the model returned by wrap_model (a DDP module).")
        return model.no_sync()

    def join(self, model: nn.Module, *stateful: Any, enable: bool = True) -> ContextManager:
        """torch's ``Join`` over the DDP model; then `stateful` is copied from the last rank to finish."""
        if not isinstance(model, DistributedDataParallel):
            raise ConfigurationError("join needs the model returned by wrap_model (a DDP module).")
        from ...training.join import ddp_join

        return ddp_join(self, model, stateful, enable)

    def _on_comm_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """NCCL reduces CUDA tensors only: move a CPU tensor to this rank's GPU."""
        if self.transport == "nccl" and tensor.device.type != "cuda":
            return tensor.to(self.device)
        return tensor

    def _allreduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        work = self._on_comm_device(tensor)
        use_avg = op == "mean" and self.transport == "nccl"
        reduce_op = dist.ReduceOp.AVG if use_avg else getattr(dist.ReduceOp, _TORCH_OPS[op])
        dist.all_reduce(work, op=reduce_op)
        if op == "mean" and not use_avg:
            work.div_(self.world_size)
        return work.to(tensor.device)

    def _broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        work = self._on_comm_device(tensor)
        dist.broadcast(work, src=src)
        return work.to(tensor.device)

    def _allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        work = self._on_comm_device(tensor)
        out = [torch.empty_like(work) for _ in range(self.world_size)]
        dist.all_gather(out, work)
        return [t.to(tensor.device) for t in out]

    def _barrier(self) -> None:
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()
