"""nccl-tests-style collective sweep one rank runs, on the backend's own library.

Each collective is the raw library's call (the backend's ``raw_loop``: torch.distributed's or
horovod's, what training sends its gradients through), or paraflow's public call for a backend
that names no raw library (reduce_scatter has no public call). For each collective and size
(float32 elements): a warm-up, a barrier, then one timed operation per round, as many rounds as
the size's operations (about BYTES_PER_SIZE bytes moved), at least `rounds`; the time per
operation is the median over rounds. Then one checked operation on a known pattern: rank r holds
(r + 1) * (i % 13 + 1) at element i, so every expected element is a small integer, exact in
float32 (and in float16 and bfloat16); elements that differ are counted as #wrong. Sizes follow
nccl-tests: the whole buffer for allreduce and broadcast, the gathered output for allgather, the
scattered input for reduce_scatter.
"""

from __future__ import annotations

import statistics
import time

import torch

from .train_loop import device_sync

__all__ = [
    "run_sweep",
    "iterations_for",
    "pattern",
    "expected",
    "count_wrong",
    "ROUNDS",
    "MIN_WARMUP",
]

#: Roughly this many bytes are moved per size, so small messages get many iterations: up to
#: MAX_ITERS from LARGE_BYTES up, MAX_SMALL_ITERS below, where latency (and horovod's 1 ms cycle)
#: sets the time.
BYTES_PER_SIZE = 256 * 1024**2
LARGE_BYTES = 1024**2
MIN_ITERS, MAX_SMALL_ITERS, MAX_ITERS = 4, 40, 200
ROUNDS = 12  # timed operations per size, at least (default)
#: Warm-up calls (first calls allocate and connect).
MIN_WARMUP = 4


def iterations_for(size_bytes: int) -> int:
    """Timed operations for one message size: many for small messages, at least MIN_ITERS."""
    most = MAX_ITERS if size_bytes >= LARGE_BYTES else MAX_SMALL_ITERS
    return max(MIN_ITERS, min(most, BYTES_PER_SIZE // max(size_bytes, 1)))


def pattern(rank: int, count: int, dtype: torch.dtype = torch.float32, device="cpu") -> torch.Tensor:
    """Rank `rank`'s input: (rank + 1) * (i % 13 + 1), tiled from its first 13 elements (an
    element-wise modulo over 16M elements took 0.4 s, a tenth of a 64 MB sweep step)."""
    period = (torch.arange(1, 14, device=device) * (rank + 1)).to(dtype)
    return period.repeat(-(-count // 13))[:count]


def expected(collective: str, n: int, rank: int, count: int, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """The exact result `collective` must give on `rank` for inputs from :func:`pattern` (broadcast from 0)."""
    if collective == "allreduce":
        return pattern(n * (n + 1) // 2 - 1, count, dtype, device)
    if collective == "allgather":
        return torch.cat([pattern(r, count, dtype, device) for r in range(n)])
    if collective == "reduce_scatter":
        return pattern(n * (n + 1) // 2 - 1, count * n, dtype, device)[rank * count : (rank + 1) * count]
    if collective == "broadcast":
        return pattern(0, count, dtype, device)
    raise ValueError(f"unknown collective {collective!r}")


def count_wrong(result, want: torch.Tensor) -> int:
    """Elements of `result` that differ from `want` (a list is concatenated; a wrong shape counts all)."""
    if isinstance(result, (list, tuple)):
        result = torch.cat([t.reshape(-1) for t in result])
    if result.shape != want.shape:
        return int(want.numel())
    return int((result.to(want.device) != want).sum())


def _call(collective: str, backend, raw, n: int, count: int, device) -> tuple:
    """(which call, its buffer's length, the call on a buffer) for `collective`; count = elements per rank."""
    if raw is None:  # no raw library named: paraflow's public calls
        public = {
            "allreduce": lambda t: backend.allreduce_(t, "sum"),
            "broadcast": lambda t: backend.broadcast_(t, 0),
            "allgather": lambda t: backend.allgather(t),
        }
        if collective not in public:
            raise ValueError(f"no {collective} to time under {backend.name}: paraflow has no public {collective}")
        return "paraflow", count, public[collective]
    if collective == "allreduce":
        return "raw", count, raw.allreduce_
    if collective == "broadcast":
        return "raw", count, lambda t: raw.broadcast_(t, 0)
    if collective == "allgather":
        out = torch.empty(count * n, device=device)
        return "raw", count, lambda t: raw.allgather(t, out)
    if collective == "reduce_scatter":
        out = torch.empty(count, device=device)
        return "raw", count * n, lambda t: raw.reduce_scatter(t, out)
    raise ValueError(f"unknown collective {collective!r}")


def _timed(call, buffer, device) -> float:
    start = time.perf_counter()
    call(buffer)
    device_sync(device)
    return time.perf_counter() - start


def _one_size(backend, raw, collective: str, size: int, rounds: int) -> dict:
    device, n, rank = backend.device, backend.world_size, backend.rank
    element = torch.tensor([]).element_size()
    whole = collective in ("allreduce", "broadcast")
    count = max(1, size // element if whole else size // (element * n))
    impl, length, call = _call(collective, backend, raw, n, count, device)
    buffer = torch.zeros(length, device=device)
    total_bytes = count * element * (1 if whole else n)
    iters = max(rounds, iterations_for(total_bytes))
    for _ in range(MIN_WARMUP):
        call(buffer)
    device_sync(device)
    backend.barrier()
    times = [_timed(call, buffer, device) for _ in range(iters)]
    result = call(pattern(rank, length, device=device))
    device_sync(device)
    return {
        "collective": collective,
        "impl": impl,
        "bytes": total_bytes,
        "count": count * (1 if whole else n),
        "iters": iters,
        "time_s": statistics.median(times),
        "round_s": times,
        "wrong": count_wrong(result, expected(collective, n, rank, count, torch.float32, device)),
    }


def run_sweep(backend, raw, sizes: list, collectives: list, rounds: int = ROUNDS) -> dict:
    """Sweep `sizes` (bytes) for each collective; this rank's times and checks.

    `raw` is the backend's ``raw_loop`` (None: paraflow's public calls).
    A collective the library refuses becomes an entry of "unsupported" with the error.
    """
    rows, unsupported = [], []
    for collective in collectives:
        try:
            for size in sizes:
                rows.append(_one_size(backend, raw, collective, size, rounds))
        except (ValueError, TypeError, RuntimeError) as exc:
            if backend.world_size > 1:
                backend.barrier()  # every rank refuses alike; realign before the next one
            unsupported.append({"collective": collective, "error": str(exc)[:200]})
    return {"world_size": backend.world_size, "device": str(backend.device), "rows": rows, "unsupported": unsupported}
