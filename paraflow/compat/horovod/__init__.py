"""Horovod's PyTorch API on every paraflow backend: ``import paraflow.compat.horovod as hvd``.

A script written for ``horovod.torch`` runs unchanged but for that import (or with no change at
all under ``paraflow run --horovod-api``) on the backend ``PARAFLOW_BACKEND`` names, which
``paraflow run --backend`` sets: ddp-gloo, ddp-nccl and fsdp through torch.distributed
(:mod:`.ops`, :mod:`.optimizer`), single in one process, and horovod itself, where every call
goes to the real ``horovod.torch``. Horovod's scripts never wrap the model, so on fsdp too the
model is replicated and its gradients averaged by ``DistributedOptimizer``; sharding needs
paraflow's own ``backend.wrap_model``. A name Horovod has and this API has not raises an
AttributeError saying what to use instead (docs: Migrating from Horovod).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any, Callable

import torch

from . import exchange, functions, ops, optimizer, runtime
from .layers import Compression, SyncBatchNorm
from .ops import Adasum, Average, Max, Min, Product, Sum, global_process_set

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "is_homogeneous", "nccl_built", "mpi_built", "gloo_built", "mpi_enabled", "gloo_enabled",
    "mpi_threads_supported", "cuda_built", "rocm_built", "ddl_built", "ccl_built",
    "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
    "allgather_object", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "allgather", "allgather_async",
    "grouped_allgather", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall",
    "reducescatter", "grouped_reducescatter", "synchronize", "poll", "join", "barrier",
    "Average", "Sum", "Min", "Max", "Product", "Adasum", "Compression", "SyncBatchNorm", "global_process_set",
    "elastic", "HorovodInternalError",
]  # fmt: skip


def _passes_through(function: Callable) -> Callable:
    """`function`, or the real Horovod's function of that name on a backend that runs Horovod."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        native = runtime.native()
        if native is None:
            return function(*args, **kwargs)
        if kwargs.get("process_set") is global_process_set:
            kwargs["process_set"] = native.global_process_set
        return getattr(native, function.__name__)(*args, **kwargs)

    return call


# ---------------------------------------------------------------- start, stop, who am I
def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start the backend ``PARAFLOW_BACKEND`` names (``paraflow.init()``'s choice), or join the one
    the script started; a second call does nothing."""
    if comm is not None or process_sets is not None:
        raise AttributeError(
            "hvd.init(comm=..., process_sets=...) is not available: ranks come from the launcher and the only "
            "process set is the global one. Call hvd.init(), or run on Horovod itself (paraflow run --backend horovod)."
        )
    runtime.start()


def shutdown() -> None:
    """Leave the job (every rank's final barrier); also done at exit if the script does not."""
    runtime.stop()


def is_initialized() -> bool:
    """Whether ``init()`` was called (and ``shutdown()`` not since)."""
    return runtime.started()


@_passes_through
def rank() -> int:
    """This process's global rank."""
    return runtime.backend().rank


@_passes_through
def size() -> int:
    """The number of processes in the job."""
    return runtime.backend().world_size


@_passes_through
def local_rank() -> int:
    """This process's rank on its host."""
    return runtime.backend().local_rank


@_passes_through
def local_size() -> int:
    """The number of processes on this host."""
    return runtime.backend().local_world_size


@_passes_through
def cross_rank() -> int:
    """This host's index (launchers place ranks host by host: rank // local_size)."""
    backend = runtime.backend()
    return backend.rank // backend.local_world_size


@_passes_through
def cross_size() -> int:
    """The number of hosts."""
    backend = runtime.backend()
    return -(-backend.world_size // backend.local_world_size)


@_passes_through
def is_homogeneous() -> bool:
    """Whether every host runs as many processes (as launchers place them)."""
    backend = runtime.backend()
    return backend.world_size % backend.local_world_size == 0


def _transport() -> str:
    return runtime.backend().transport if runtime.started() else ""


@_passes_through
def mpi_built() -> bool:
    """False: torch.distributed moves the tensors here, not MPI."""
    return False


@_passes_through
def mpi_enabled() -> bool:
    """False: torch.distributed moves the tensors here, not MPI."""
    return False


@_passes_through
def mpi_threads_supported() -> bool:
    """False: no MPI here."""
    return False


@_passes_through
def gloo_built() -> bool:
    """Whether this torch has gloo."""
    return torch.distributed.is_available() and torch.distributed.is_gloo_available()


@_passes_through
def gloo_enabled() -> bool:
    """Whether the backend's process group is gloo."""
    return _transport() == "gloo"


@_passes_through
def nccl_built() -> bool:
    """Whether this torch has NCCL."""
    return torch.distributed.is_available() and torch.distributed.is_nccl_available()


@_passes_through
def cuda_built() -> bool:
    """Whether this torch was built with CUDA."""
    return torch.backends.cuda.is_built()


@_passes_through
def rocm_built() -> bool:
    """Whether this torch was built for ROCm."""
    return torch.version.hip is not None


@_passes_through
def ddl_built() -> bool:
    """False: IBM DDL is Horovod's alone."""
    return False


@_passes_through
def ccl_built() -> bool:
    """False: oneCCL is Horovod's alone."""
    return False


# ---------------------------------------------------------------- the rest of Horovod's names
_distributed_optimizer = _passes_through(optimizer.DistributedOptimizer)


@functools.wraps(optimizer.DistributedOptimizer)
def DistributedOptimizer(*args: Any, **kwargs: Any) -> torch.optim.Optimizer:  # noqa: N802 - Horovod's name
    return runtime.optimizer_made(_distributed_optimizer(*args, **kwargs))


broadcast_parameters = _passes_through(functions.broadcast_parameters)
broadcast_optimizer_state = _passes_through(functions.broadcast_optimizer_state)
broadcast_object = _passes_through(functions.broadcast_object)
allgather_object = _passes_through(functions.allgather_object)
allreduce = _passes_through(ops.allreduce)
allreduce_ = _passes_through(ops.allreduce_)
allreduce_async = _passes_through(ops.allreduce_async)
allreduce_async_ = _passes_through(ops.allreduce_async_)
grouped_allreduce = _passes_through(ops.grouped_allreduce)
grouped_allreduce_ = _passes_through(ops.grouped_allreduce_)
grouped_allreduce_async = _passes_through(ops.grouped_allreduce_async)
grouped_allreduce_async_ = _passes_through(ops.grouped_allreduce_async_)
allgather = _passes_through(exchange.allgather)
allgather_async = _passes_through(exchange.allgather_async)
grouped_allgather = _passes_through(exchange.grouped_allgather)
broadcast = _passes_through(exchange.broadcast)
broadcast_ = _passes_through(exchange.broadcast_)
broadcast_async = _passes_through(exchange.broadcast_async)
broadcast_async_ = _passes_through(exchange.broadcast_async_)
alltoall = _passes_through(exchange.alltoall)
reducescatter = _passes_through(exchange.reducescatter)
grouped_reducescatter = _passes_through(exchange.grouped_reducescatter)
synchronize = _passes_through(ops.synchronize)
poll = _passes_through(ops.poll)
join = _passes_through(exchange.join)
barrier = _passes_through(exchange.barrier)

#: What to use instead of Horovod's names this API does not have.
INSTEAD = {
    "start_timeline": "Horovod's timeline: on DDP and FSDP record with torch.profiler (its trace opens in the same "
    "viewer), or run on Horovod itself with paraflow run --backend horovod",
    "stop_timeline": "Horovod's timeline: see start_timeline; use torch.profiler",
    "ProcessSet": "Horovod's process sets: use torch.distributed.new_group(ranks) for a subgroup",
    "add_process_set": "Horovod's process sets: use torch.distributed.new_group(ranks)",
    "remove_process_set": "Horovod's process sets: use torch.distributed.destroy_process_group(group)",
    "sparse_allreduce_async": "hvd.allreduce_async on the dense tensor (DistributedOptimizer reduces sparse "
    "gradients as dense)",
    "grouped_allgather_async": "hvd.allgather_async on each tensor",
    "grouped_reducescatter_async": "hvd.reducescatter on each tensor",
    "reducescatter_async": "hvd.reducescatter",
    "alltoall_async": "hvd.alltoall",
}


def __getattr__(name: str) -> Any:
    if name == "elastic":
        return _elastic()
    native = runtime.native()
    if name == "HorovodInternalError":
        if native is not None:
            return native.HorovodInternalError
        from ...errors import CollectiveError

        return CollectiveError
    if native is not None and not name.startswith("__") and hasattr(native, name):
        return getattr(native, name)
    if name.startswith("__"):
        raise AttributeError(name)
    hint = INSTEAD.get(name, "see the list of supported names on the docs page Migrating from Horovod")
    raise AttributeError(
        f"hvd.{name} is not part of paraflow's Horovod API (paraflow.compat.horovod); instead: {hint}. "
        "On Horovod itself (paraflow run --backend horovod) every name of horovod.torch is there."
    )


def _elastic() -> Any:
    """paraflow.elastic, whose names are Horovod Elastic's, on every backend (docs/elastic.md)."""
    return importlib.import_module("paraflow.elastic")
