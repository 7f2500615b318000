"""How busy the machine is when a run starts, judged on the moment rather than the last minute.

The 1-minute load average decays slowly: right after one benchmark run it still reads above the
core count on a machine that has gone quiet, and ``--pin auto`` used to leave the next run
unpinned for that reason alone (a back-to-back pair then compared a pinned run with an unpinned
one). The kernel's count of runnable threads (/proc/loadavg's fourth field), sampled over half a
second, says whether other work holds the cores now.
"""

from __future__ import annotations

import time
from typing import Optional

__all__ = ["runnable_others"]

LOADAVG = "/proc/loadavg"


def runnable_others(seconds: float = 0.5, samples: int = 10, path: str = LOADAVG) -> Optional[float]:
    """Mean number of runnable threads besides the reading one, over `seconds` in `samples`
    readings of `path` ("1min 5min 15min running/total lastpid"); None where it cannot be read."""
    counts = []
    for i in range(samples):
        try:
            with open(path) as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        counts.append(max(running - 1, 0))  # the reader itself is running
        if i + 1 < samples:
            time.sleep(seconds / samples)
    return sum(counts) / len(counts)
