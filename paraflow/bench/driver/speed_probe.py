"""The machine's own speed, probed after every launch: a fixed single-threaded kernel, timed.

On a shared or virtual machine the host's speed drifts by itself: here 50 products of two
256 x 256 matrices took 16.6-21.4 ms within two minutes with nothing else running. Two runs
minutes apart can then disagree on every figure while nothing in them changed. The probe runs
in the driver between launches (about 0.04 s each), so a run records how fast the machine
itself was along the way, and `paraflow bench compare` can say how much of a difference
between two runs the machine explains.
"""

from __future__ import annotations

import statistics
import time
from typing import Optional

import torch

__all__ = ["probe_ms", "probe_summary"]

SIZE = 256  # the kernel: LOOPS products of two SIZE x SIZE float32 matrices, one thread
LOOPS = 20
SAMPLES = 5  # timings per probe; the probe is their median


def probe_ms() -> float:
    """Median milliseconds of SAMPLES timings of the fixed kernel, on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.full((SIZE, SIZE), 0.5)
        b = torch.full((SIZE, SIZE), 0.25)
        a @ b  # first call: allocations and dispatch, not timed
        timings = []
        for _ in range(SAMPLES):
            start = time.perf_counter()
            for _ in range(LOOPS):
                a @ b
            timings.append((time.perf_counter() - start) * 1000)
        return statistics.median(timings)
    finally:
        torch.set_num_threads(threads)


def probe_summary(cells: list) -> Optional[dict]:
    """The probes of a run's launches: count, median, min, max and spread ((max - min) / median), or None."""
    probes = [c["probe_ms"] for c in cells if c.get("probe_ms") is not None]
    if not probes:
        return None
    middle = statistics.median(probes)
    return {
        "kernel": f"{LOOPS} products of {SIZE}x{SIZE} float32 matrices, 1 thread, median of {SAMPLES}",
        "count": len(probes),
        "median_ms": round(middle, 3),
        "min_ms": round(min(probes), 3),
        "max_ms": round(max(probes), 3),
        "spread": round((max(probes) - min(probes)) / middle, 4),
    }
