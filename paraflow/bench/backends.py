"""What the benchmark knows about each backend: its hand-written loop, which backends share their
collectives, and which ones a default run leaves out. Keyed by backend class (a subclass inherits
its base's entry); the backends themselves know nothing of the benchmark.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

__all__ = ["raw_loop", "collectives_key", "skip_reason", "no_sync_communicates"]

_BACKENDS = "paraflow.backends."

#: Backend class -> the same training set up by hand on the raw library, as the library's own
#: guide does it (wrap, and the collectives the sweep times). The abstraction overhead compares
#: a paraflow step with it; it runs on the library paraflow started.
_RAW_LOOPS = {
    _BACKENDS + "ddp.backend.DDPBackend": _BACKENDS + "ddp.raw_loop:RawDDP",
    _BACKENDS + "fsdp.backend.FSDPBackend": _BACKENDS + "fsdp.raw_loop:RawFSDP",
    _BACKENDS + "horovod.backend.HorovodBackend": _BACKENDS + "horovod.raw_loop:RawHorovod",
}
_TORCH_DISTRIBUTED = _BACKENDS + "torch_distributed.TorchDistributedBackend"
_DATA_PARALLEL = _BACKENDS + "dp.DataParallelBackend"
_FSDP = _BACKENDS + "fsdp.backend.FSDPBackend"


def _names(cls: type) -> list:
    """The dotted names of `cls` and its bases, most derived first."""
    return [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__]


def raw_loop(cls: type, **presets: Any) -> Optional[Any]:
    """A new hand-written loop for backend class `cls`, or None where it has none."""
    target = next((_RAW_LOOPS[n] for n in _names(cls) if n in _RAW_LOOPS), None)
    if target is None:
        return None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)()


def collectives_key(cls: type, process_group: str = "auto", **_: Any) -> tuple:
    """Backends with the same key run the same code for their public collectives, so the sweep
    times them once per launcher and process count: DDP and FSDP share torch.distributed's."""
    if _TORCH_DISTRIBUTED in _names(cls):
        from ..backends.torch_distributed import process_group_transport

        return ("torch.distributed", process_group_transport(process_group))
    return (cls.__module__, cls.__qualname__)


def skip_reason(cls: type, cuda_devices: int, **_: Any) -> Optional[str]:
    """Why a default run leaves backend class `cls` out on this host, or None."""
    if _DATA_PARALLEL in _names(cls) and not cuda_devices:
        return "no GPU: DataParallel would be a pass-through of single (ask for it with --backend dp)"
    return None


def no_sync_communicates(backend: Any) -> bool:
    """Whether a step under ``no_sync`` still communicates (FSDP all-gathers its parameters)."""
    return _FSDP in _names(type(backend))
