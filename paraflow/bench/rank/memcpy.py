"""This machine's memory-copy bandwidth, the yardstick each backend's allreduce busbw is held to.

For each size, copies a float32 buffer into another (``dst.copy_(src)``) `iters` times and
reports size / time per copy: each byte counted once, as algbw counts it (STREAM's "copy"
would count the read and the write, twice this figure).
"""

from __future__ import annotations

import time

import torch

from .sweep import iterations_for
from .train_loop import device_sync

__all__ = ["run_memcpy"]

DTYPE = torch.float32


def _sweep(sizes: list[int], device: torch.device, warmup: int = 2) -> list[dict]:
    element = torch.tensor([], dtype=DTYPE).element_size()
    rows = []
    for size in sizes:
        count = max(1, size // element)
        src = torch.ones(count, dtype=DTYPE, device=device)
        dst = torch.empty_like(src)
        iters = max(10, iterations_for(count * element))  # copies are cheap: at least 10
        for _ in range(warmup):
            dst.copy_(src)
        device_sync(device)
        start = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src)
        device_sync(device)
        rows.append({"bytes": count * element, "iters": iters, "time_s": (time.perf_counter() - start) / iters})
    return rows


def run_memcpy(sizes: list[int], threads: int) -> dict:
    """Copy bandwidth on the CPU with `threads` threads (the count each rank uses), and on GPU 0 if present."""
    torch.set_num_threads(threads)
    result = {"threads": threads, "devices": {"cpu": _sweep(sizes, torch.device("cpu"))}}
    if torch.cuda.is_available():
        result["devices"]["cuda"] = _sweep(sizes, torch.device("cuda", 0))
    return result
