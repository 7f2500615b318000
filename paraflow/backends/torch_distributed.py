"""What every torch.distributed backend shares: the process-group start and torch's collectives.

DDP and FSDP differ only in how they wrap the model; the process group (gloo or NCCL), the
rendezvous under each launcher (a per-attempt store under torchrun restarts, a bounded start),
and the collectives behind paraflow's public calls live here once.
"""

from __future__ import annotations

import datetime
import functools
import os
from typing import Any, Optional

import torch
import torch.distributed as dist

from ..core.backend import Backend
from ..core.options import check_one_of
from ..environment.rendezvous import resolve_master
from ..errors import ConfigurationError
from ..reliability.collective_check import debug_enabled, enable_torch_debug
from ..reliability.deadlines import call_with_deadline
from ..reliability.translation import collective_errors, startup_errors

__all__ = ["TorchDistributedBackend", "store_for_this_attempt", "process_group_transport"]

_TORCH_OPS = {"sum": "SUM", "mean": "SUM", "min": "MIN", "max": "MAX"}


class TorchDistributedBackend(Backend):
    """A backend whose processes talk through a torch.distributed process group.

    Options:
        process_group: "nccl", "gloo" or "auto" (NCCL when CUDA is available, else gloo).
    """

    OPTIONS = frozenset({"process_group"})

    def __init__(self, name: str, *, process_group: str = "auto", **options: Any) -> None:
        super().__init__(name, **options)
        self.process_group = check_one_of("process_group", process_group, ("auto", "gloo", "nccl"))
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

    @classmethod
    def process_limit(cls, cuda_devices: int, process_group: str = "auto", **_: Any) -> Optional[int]:
        """NCCL takes one GPU per process."""
        return cuda_devices if process_group_transport(process_group) == "nccl" else None

    def _presets(self) -> dict:
        return {"process_group": self.process_group}

    @property
    def transport(self) -> str:
        """The torch.distributed process group in use: "nccl" or "gloo"."""
        return process_group_transport(self.process_group)

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
        addr, port = resolve_master(env)
        # torchrun's agent already holds the store at MASTER_PORT
        serves_store = env.launched_by.serves_store
        init_method = "env://" if serves_store else f"tcp://{addr}:{port}"
        kwargs = {"device_id": self.device} if self.device.type == "cuda" else {}
        if debug_enabled():
            enable_torch_debug()

        def start() -> None:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # the helper thread's own current device
            agent_store = serves_store and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            # torchrun's restarts reuse its agent's store
            store = store_for_this_attempt(addr, port, env.world_size, self.timeout) if agent_store else None
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

    def _before_destroy(self) -> None:
        """What a subclass must release while the process group still exists (default: nothing)."""

    def _shutdown(self) -> None:
        error: Optional[Exception] = None
        if self._owns_group and dist.is_initialized() and not self._leaving_on_error and self.world_size > 1:
            # Nobody leaves while a rank still needs the job: a rank that never gets here (stopped,
            # stuck) is reported after the timeout instead of the job ending "successfully" without it.
            try:
                with collective_errors(self, "the barrier in shutdown() (leaving paraflow.init)"):
                    self._final_barrier()
            except Exception as exc:  # noqa: BLE001 - raised once the process group is gone
                error = exc
        self._before_destroy()
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False
        self._leaving_on_error = False
        if error is not None:
            raise error

    def _on_comm_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """NCCL reduces CUDA tensors only: move a CPU tensor to this rank's GPU."""
        if self._nccl and tensor.device.type != "cuda":
            return tensor.to(self.device)
        return tensor

    @functools.cached_property
    def _nccl(self) -> bool:
        return self.transport == "nccl"

    # One call into torch each, behind the public collectives (paraflow.core.collectives).
    def _allreduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        work = self._on_comm_device(tensor)
        if op == "mean" and self._nccl:  # NCCL averages itself
            reduce_op, divide = dist.ReduceOp.AVG, False
        else:
            reduce_op, divide = getattr(dist.ReduceOp, _TORCH_OPS[op]), op == "mean"
        dist.all_reduce(work, op=reduce_op)
        if divide:
            work.div_(self.world_size)
        return work if work is tensor else work.to(tensor.device)

    def _broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        work = self._on_comm_device(tensor)
        dist.broadcast(work, src=src)
        return work if work is tensor else work.to(tensor.device)

    def _allgather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        work = self._on_comm_device(tensor)
        out = [torch.empty_like(work) for _ in range(self.env.world_size)]
        dist.all_gather(out, work)
        return [t.to(tensor.device) for t in out]

    def _barrier(self) -> None:
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()


_SESSIONS = 0  # stores this process opened on the launcher's address, one per session


def store_for_this_attempt(address: str, port: int, world_size: int, timeout: float, *, serve: bool = False):
    """The TCPStore at `address`:`port` (served here when `serve`) under a prefix for this restart
    attempt and this session.

    torchrun's static rendezvous (the default with --master_addr/--master_port) keeps one store
    across restarts and torch adds no per-attempt prefix, so a restarted rank can read the
    address a killed rank published before and fail to connect (seen here in about half the
    restarts). A prefix per TORCHELASTIC_RESTART_COUNT keeps the attempts apart, and one per
    session started in this process keeps a second ``paraflow.init`` of the same job apart
    from the first (every rank starts its sessions in the same order).
    """
    global _SESSIONS
    _SESSIONS += 1
    store = dist.TCPStore(
        address,
        port,
        world_size,
        is_master=serve,
        timeout=datetime.timedelta(seconds=timeout),
        wait_for_workers=False,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"/paraflow/attempt_{attempt}/session_{_SESSIONS}", store)


def process_group_transport(process_group: str) -> str:
    """The process group "auto" resolves to here: NCCL with CUDA, else gloo."""
    if process_group != "auto":
        return process_group
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
