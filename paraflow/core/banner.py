"""The one line rank 0 prints at start-up: which backend, over what, how many processes, which launcher.

It makes the commonest silent surprise visible: ``python train.py --backend horovod`` without a
launcher runs one process. ``banner=False`` or ``PARAFLOW_BANNER=0`` silences it.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import torch

from ..environment.launchers import launcher_label

__all__ = ["BANNER_ENV", "banner_enabled", "banner_line"]

BANNER_ENV = "PARAFLOW_BANNER"


def banner_enabled(option: Optional[bool]) -> bool:
    """The `banner` option when given, else False when PARAFLOW_BANNER is 0/false/no/off, else True."""
    if option is not None:
        return bool(option)
    return os.environ.get(BANNER_ENV, "").strip().lower() not in ("0", "false", "no", "off")


def banner_line(backend: Any) -> str:
    """``paraflow: ddp-gloo over gloo, 2 processes, launcher torchrun, cpu, 1 thread each`` and the like."""
    controller = getattr(backend, "controller", None)
    over = f"controller {controller}, transport {backend.transport}" if controller else backend.transport
    n, threads = backend.world_size, torch.get_num_threads()
    launcher = launcher_label(backend.launcher)
    plain = backend.env.launched_by.is_plain
    where = str(backend.device) if backend.device.type == "cuda" else f"cpu, {threads} thread{'s' * (threads > 1)} each"
    line = (
        f"paraflow: {backend.name}{f' over {over}' if over not in (None, 'none') else ''}, "
        f"{n} process{'es' * (n > 1)}, {'' if plain else 'launcher '}{launcher}, {where}"
    )
    if backend.env.note:
        line += f" ({backend.env.note})"
    if plain and backend.MULTI_PROCESS:
        line += (
            f". Plain python starts one process; for N: `torchrun --nproc_per_node N {_script()}` "
            f"or `mpirun -np N python {_script()}`"
        )
    return line + f" (silence: {BANNER_ENV}=0)"


def _script() -> str:
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return script if script.endswith(".py") else "train.py"
