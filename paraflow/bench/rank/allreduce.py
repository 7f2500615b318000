"""nccl-tests-style allreduce sweep that one rank runs: time per message size, every result checked.

For each size: a few warm-up operations, a barrier, `iters` back-to-back in-place sums timed
together (per-operation time = elapsed / iters on this rank), then one checked operation on a
known pattern: rank r holds (r + 1) * (i % 13 + 1) at element i, so element i of the sum must
be n(n+1)/2 * (i % 13 + 1) exactly (small integers are exact in float32). Elements that differ
are counted as #wrong. Bandwidths come later from these raw per-rank times (metrics.py).
"""

from __future__ import annotations

import time

import torch

from .train_loop import device_sync

__all__ = ["run_allreduce", "iterations_for", "pattern", "expected_sum", "count_wrong", "DTYPE"]

DTYPE = torch.float32
#: Roughly this many bytes are reduced per size, so small messages get many iterations.
BYTES_PER_SIZE = 256 * 1024**2
MIN_ITERS, MAX_ITERS = 3, 20  # nccl-tests runs 20 by default


def iterations_for(size_bytes: int) -> int:
    """Timed iterations for one message size: many for small messages, at least MIN_ITERS."""
    return max(MIN_ITERS, min(MAX_ITERS, BYTES_PER_SIZE // max(size_bytes, 1)))


def pattern(rank: int, count: int, dtype: torch.dtype = DTYPE, device="cpu") -> torch.Tensor:
    """Rank `rank`'s input: (rank + 1) * (i % 13 + 1)."""
    return (torch.arange(count, device=device) % 13 + 1).to(dtype) * (rank + 1)


def expected_sum(world_size: int, count: int, dtype: torch.dtype = DTYPE, device="cpu") -> torch.Tensor:
    """The exact sum of every rank's pattern."""
    return (torch.arange(count, device=device) % 13 + 1).to(dtype) * (world_size * (world_size + 1) // 2)


def count_wrong(result: torch.Tensor, expected: torch.Tensor) -> int:
    """Elements of `result` that differ from `expected` (a wrong shape counts every element)."""
    if result.shape != expected.shape:
        return int(expected.numel())
    return int((result != expected).sum())


def run_allreduce(backend, sizes: list[int], warmup: int = 2) -> dict:
    """Sweep `sizes` (bytes) with the backend's public in-place allreduce; this rank's times and checks.

    ``allreduce_`` reduces in place (no defensive copy), with the cross-rank check and error
    translation every public collective has.
    """
    device = backend.device
    n, rank = backend.world_size, backend.rank
    element = torch.tensor([], dtype=DTYPE).element_size()
    rows = []
    for size in sizes:
        count = max(1, size // element)
        buffer = torch.zeros(count, dtype=DTYPE, device=device)  # zeros stay zeros: no overflow, no denormals
        iters = iterations_for(count * element)
        for _ in range(warmup):
            backend.allreduce_(buffer, "sum")
        device_sync(device)
        backend.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            out = backend.allreduce_(buffer, "sum")
        device_sync(device)
        elapsed = time.perf_counter() - start
        wrong = int((out != 0).sum())  # every timed sum of zeros must be zero
        checked = backend.allreduce_(pattern(rank, count, DTYPE, device), "sum")
        device_sync(device)
        wrong += count_wrong(checked, expected_sum(n, count, DTYPE, device))
        rows.append(
            {
                "bytes": count * element,
                "count": count,
                "dtype": str(DTYPE).replace("torch.", ""),
                "iters": iters,
                "time_s": elapsed / iters,
                "wrong": wrong,
            }
        )
    return {"world_size": n, "device": str(device), "sizes": rows}
