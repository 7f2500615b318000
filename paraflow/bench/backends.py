"""What the benchmark knows about each backend, in one table keyed by the registered name: its raw
library's collectives, whose collectives it shares, when a default run leaves it out, whether its
no-sync step still communicates, and its cost model (the messages a step sends, the allreduce
algorithm per transport, a fixed wait per operation). The backends themselves know nothing of the
benchmark. A backend registered elsewhere runs like any other; the sweep times its paraflow calls, having
no raw library call for it, and the cost model says it has no model for it instead of predicting no
communication.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["BenchFacts", "FACTS", "facts", "raw_loop", "collectives_key", "skip_reason"]

#: Seconds horovod's background thread waits between cycles (HOROVOD_CYCLE_TIME's default since 0.21).
HOROVOD_CYCLE_S = 1e-3


@dataclass(frozen=True)
class BenchFacts:
    """One backend as the benchmark sees it."""

    #: "module:Class" calling the raw library's collectives, which the sweep times.
    raw_loop: Optional[str] = None
    #: Whose code runs the public collectives: backends with the same owner are swept once per transport.
    collectives: str = "own"
    #: A default run leaves it out without a GPU (it would be a pass-through of single).
    needs_gpu: bool = False
    #: A step under ``no_sync`` still communicates (FSDP all-gathers its parameters).
    no_sync_communicates: bool = False
    #: The cost model's messages per step: "buckets" (DDP's gradient buckets), "fused" (horovod's
    #: fusion buffer), "sharded" (FSDP's all-gathers and reduce-scatters per unit), "none" (one process).
    messages: str = "none"
    #: The allreduce algorithm per transport, where it is not a ring.
    algorithms: Mapping[str, str] = field(default_factory=dict)
    #: Seconds every operation waits whatever its size.
    fixed_s: float = 0.0


_BACKENDS = "paraflow.backends."
_DDP = BenchFacts(raw_loop=_BACKENDS + "ddp.raw_loop:RawDDP", collectives="torch.distributed", messages="buckets")

FACTS: dict[str, BenchFacts] = {
    "single": BenchFacts(),
    "dp": BenchFacts(needs_gpu=True),
    "ddp": _DDP,  # the alias of ddp-gloo or ddp-nccl, whichever this host gets
    "ddp-gloo": _DDP,
    "ddp-nccl": _DDP,
    "fsdp": BenchFacts(
        raw_loop=_BACKENDS + "ddp.raw_loop:RawDDP",
        collectives="torch.distributed",
        no_sync_communicates=True,
        messages="sharded",
    ),
    "horovod": BenchFacts(
        raw_loop=_BACKENDS + "horovod.raw_loop:RawHorovod",
        messages="fused",
        algorithms={"mpi": "rabenseifner"},  # horovod's MPI controller runs MPI_Allreduce
        fixed_s=HOROVOD_CYCLE_S,
    ),
}


def facts(name: str) -> Optional[BenchFacts]:
    """The benchmark's facts about registered backend `name`, or None."""
    return FACTS.get(name)


def raw_loop(name: str) -> Optional[Any]:
    """A new raw-library caller for backend `name`, or None where it has none."""
    known = facts(name)
    if known is None or known.raw_loop is None:
        return None
    module, _, cls = known.raw_loop.partition(":")
    return getattr(importlib.import_module(module), cls)()


def collectives_key(name: str) -> tuple:
    """Backends with the same key run the same code for their public collectives, so the sweep
    times them once per launcher and process count: DDP and FSDP share torch.distributed's."""
    known = facts(name)
    if known is not None and known.collectives == "torch.distributed":
        from ..backends.torch_distributed import process_group_transport
        from ..core.registry import spec

        return ("torch.distributed", process_group_transport(spec(name).presets.get("process_group", "auto")))
    return (name,)


def skip_reason(name: str, cuda_devices: int) -> Optional[str]:
    """Why a default run leaves backend `name` out on this host, or None."""
    known = facts(name)
    if known is not None and known.needs_gpu and not cuda_devices:
        return f"no GPU: {name} would be a pass-through of single (ask for it with --backend {name})"
    return None
