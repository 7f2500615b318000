"""Warm-up that ends when step times have settled, not after a fixed count.

The first steps of a run are slow for reasons that have nothing to do with the method measured:
DDP rebuilds its buckets on the first iteration, horovod negotiates each new tensor, the
allocator and caches fill, and a launcher's siblings may still be starting. Warm-up runs until
the median of the last WINDOW steps is within TOLERANCE of the median of the WINDOW before
(at least `min_steps`, at most MAX_STEPS steps or MAX_SECONDS of steps). Each step's time is
the slowest rank's, shared by an allreduce, so every rank stops after the same step.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

__all__ = ["warm_up", "settled", "WINDOW", "TOLERANCE", "MAX_STEPS", "MAX_SECONDS"]

WINDOW = 5
TOLERANCE = 0.10
MAX_STEPS = 200
MAX_SECONDS = 2.0


def settled(times: list, window: int = WINDOW, tolerance: float = TOLERANCE) -> bool:
    """True when the last `window` times' median is within `tolerance` of the `window` before's."""
    if len(times) < 2 * window:
        return False
    last = statistics.median(times[-window:])
    before = statistics.median(times[-2 * window : -window])
    return abs(last - before) <= tolerance * last


def warm_up(backend, run_step: Callable[[], float], min_steps: int, max_seconds: float = MAX_SECONDS) -> dict:
    """Run untimed steps until their times settle; returns the slowest rank's times, this rank's
    losses and whether the times settled.

    `run_step` runs one step, synchronises the device and returns the loss. The stopping rule
    only reads numbers every rank shares (the count and the slowest-rank times), so all ranks
    stop together.
    """
    times: list = []
    losses: list = []
    while True:
        start = time.perf_counter()
        losses.append(run_step())
        elapsed = time.perf_counter() - start
        if backend.world_size > 1:
            elapsed = float(backend.allreduce(torch.tensor([elapsed], dtype=torch.float64), op="max").item())
        times.append(elapsed)
        if len(times) >= min_steps and settled(times):
            return {"warmup_s": times, "warmup_losses": losses, "warmup_settled": True}
        if len(times) >= max(min_steps, MAX_STEPS) or sum(times) >= max_seconds and len(times) >= min_steps:
            return {"warmup_s": times, "warmup_losses": losses, "warmup_settled": False}
