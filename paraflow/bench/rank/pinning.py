"""Pin each rank's threads to cores of its own, the same way under every launcher.

mpirun could bind (``--bind-to core``) but torchrun, horovodrun and plain python cannot, so each
rank binds itself (``sched_setaffinity``) before torch starts its threads: local rank i of a
launch takes the i-th run of `threads` cores of the cores the launch may use. Threads started
later (torch's pool, horovod's background thread, MPI's) inherit the mask. Without pinning the
scheduler moves ranks between cores and two ranks' threads can share one core for a while,
which is one of the ways two launches of the same cell disagree.
"""

from __future__ import annotations

import os
from typing import Optional

__all__ = ["pin_rank", "local_rank_from_env", "cores_for"]

# Each launcher's local-rank variable: torchrun, Open MPI (mpirun), horovodrun --gloo.
_LOCAL_RANK = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "HOROVOD_LOCAL_RANK")


def local_rank_from_env(env=os.environ) -> int:
    """This process's rank on its host, from whichever launcher started it (0 under plain python)."""
    for key in _LOCAL_RANK:
        if env.get(key, "").strip().isdigit():
            return int(env[key])
    return 0


def cores_for(local_rank: int, threads: int, allowed: list) -> list:
    """The `threads` cores local rank `local_rank` takes from `allowed` (wrapping when ranks outnumber cores)."""
    allowed = sorted(allowed)
    threads = max(1, min(threads, len(allowed)))
    start = (local_rank * threads) % len(allowed)
    return [allowed[(start + i) % len(allowed)] for i in range(threads)]


def pin_rank(threads: int, env=os.environ) -> Optional[list]:
    """Bind this process to its own cores; returns them, or None where the OS cannot bind."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    chosen = cores_for(local_rank_from_env(env), threads, list(os.sched_getaffinity(0)))
    os.sched_setaffinity(0, chosen)
    return chosen
