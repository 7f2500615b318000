"""Debug mode, ``PARAFLOW_DEBUG=1``: the cross-rank check, torch's debug output, a trace of every collective.

Debug mode turns on:

- the cross-rank check before every public collective (``check_collectives``,
  :mod:`paraflow.reliability.collective_check`): mismatching calls raise CollectiveError at once;
- ``TORCH_DISTRIBUTED_DEBUG=INFO`` before the process group starts, unless the variable is
  already set: DDP then logs its set-up and names the parameters that got no gradient. (torch
  2.13's ``DETAIL`` level wraps the process group in a checker that crashes DDP's constructor
  with a segmentation fault on gloo, so paraflow does not pick it; set it yourself to try.)
- one line on stderr per rank before each paraflow collective (sequence number, call, call site),
  so the last line each rank printed shows where a stuck job stopped.
"""

from __future__ import annotations

import os
import sys

__all__ = ["DEBUG_ENV", "debug_enabled", "enable_torch_debug", "trace"]

DEBUG_ENV = "PARAFLOW_DEBUG"
TORCH_DEBUG_LEVEL = "INFO"


def debug_enabled() -> bool:
    """True when PARAFLOW_DEBUG is set to 1, true, yes or on."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def enable_torch_debug() -> None:
    """Turn on torch's distributed debug output, unless TORCH_DISTRIBUTED_DEBUG is already set.

    torch reads the variable when ``torch.distributed`` is imported, so the level is applied
    again here; call before the process group starts.
    """
    os.environ.setdefault("TORCH_DISTRIBUTED_DEBUG", TORCH_DEBUG_LEVEL)
    import torch.distributed as dist

    dist.set_debug_level_from_env()


def trace(rank: int, text: str) -> None:
    """Print one debug-mode line for `rank` on stderr."""
    print(f"[paraflow debug] rank {rank}: {text}", file=sys.stderr, flush=True)
