"""nccl-tests-style collective sweep one rank runs: paraflow's public call beside the raw library's.

For each collective and size (float32 elements): a warm-up (long enough for paraflow's check to settle into
the form a repeated call takes), a barrier, then rounds in which the raw library's call and
paraflow's public call each run once, timed alone, the order flipping every round: load that
drifts during the sweep hits both alike, and every round is a pair. There are as many rounds as
the size's operations (about BYTES_PER_SIZE bytes moved), at least `rounds`; a side's time per
operation is the median over rounds. Then one checked operation per
side on a known pattern: rank r holds (r + 1) * (i % 13 + 1) at element i, so every expected
element is a small integer, exact in float32 (and in float16 and bfloat16); elements that differ are
counted as #wrong. Sizes follow nccl-tests: the whole buffer for allreduce and broadcast, the
gathered output for allgather, the scattered input for reduce_scatter.

paraflow's calls are the in-place ``allreduce_`` and ``broadcast_`` and the list-returning
``allgather``, each with the cross-rank check and error translation every public collective has;
reduce_scatter has no public call and is measured on the raw library only.
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

#: Roughly this many bytes are moved per size and side, so small messages get many iterations:
#: up to MAX_ITERS from LARGE_BYTES up, where paraflow's fixed cost is a few percent of the call
#: and a 1 MB ratio over 200 pairs scatters about half as much between launches as over 40; below,
#: where latency (and horovod's 1 ms cycle) sets the time, MAX_SMALL_ITERS resolve the ratio.
BYTES_PER_SIZE = 256 * 1024**2
LARGE_BYTES = 1024**2
MIN_ITERS, MAX_SMALL_ITERS, MAX_ITERS = 4, 40, 200
ROUNDS = 12  # alternating raw / public pairs per size, at least (default)
#: Warm-up calls per side (first calls allocate and connect).
MIN_WARMUP = 4


def iterations_for(size_bytes: int) -> int:
    """Timed operations per side for one message size: many for small messages, at least MIN_ITERS."""
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


def _calls(collective: str, backend, raw, n: int, count: int, dtype, device) -> dict:
    """side -> (make its input buffer, the call on a buffer) for `collective`; count = elements per rank."""
    if collective == "allreduce":
        sides = {"raw": raw.allreduce_, "public": lambda t: backend.allreduce_(t, "sum")}
        size = count
    elif collective == "broadcast":
        sides = {"raw": lambda t: raw.broadcast_(t, 0), "public": lambda t: backend.broadcast_(t, 0)}
        size = count
    elif collective == "allgather":
        out = torch.empty(count * n, dtype=dtype, device=device)
        sides = {"raw": lambda t: raw.allgather(t, out), "public": backend.allgather}
        size = count
    elif collective == "reduce_scatter":
        out = torch.empty(count, dtype=dtype, device=device)
        sides = {"raw": lambda t: raw.reduce_scatter(t, out)}
        size = count * n
    else:
        raise ValueError(f"unknown collective {collective!r}")
    return {side: (size, call) for side, call in sides.items() if raw is not None or side != "raw"}


def _timed(call, buffer, device) -> float:
    start = time.perf_counter()
    call(buffer)
    device_sync(device)
    return time.perf_counter() - start


def _one_size(backend, raw, collective: str, size: int, rounds: int) -> list:
    device, n, rank = backend.device, backend.world_size, backend.rank
    dtype = torch.float32
    element = torch.tensor([], dtype=dtype).element_size()
    per_rank = size // element if collective in ("allreduce", "broadcast") else size // (element * n)
    count = max(1, per_rank)
    sides = _calls(collective, backend, raw, n, count, dtype, device)
    buffers = {side: torch.zeros(length, dtype=dtype, device=device) for side, (length, _) in sides.items()}
    total_bytes = count * element * (1 if collective in ("allreduce", "broadcast") else n)
    pairs = max(rounds, iterations_for(total_bytes))
    for side, (_, call) in sides.items():
        for _ in range(MIN_WARMUP):
            call(buffers[side])
    device_sync(device)
    backend.barrier()
    times = {side: [] for side in sides}
    for i in range(pairs):
        for side in list(sides) if i % 2 == 0 else list(sides)[::-1]:
            times[side].append(_timed(sides[side][1], buffers[side], device))
    rows = []
    for side, (length, call) in sides.items():
        result = call(pattern(rank, length, dtype, device))
        device_sync(device)
        wrong = count_wrong(result, expected(collective, n, rank, count, dtype, device))
        rows.append(
            {
                "collective": collective,
                "impl": side,
                "bytes": total_bytes,
                "count": count * (1 if collective in ("allreduce", "broadcast") else n),
                "iters": pairs,
                "time_s": statistics.median(times[side]),
                "round_s": times[side],
                "wrong": wrong,
            }
        )
    return rows


def run_sweep(backend, raw, sizes: list, collectives: list, rounds: int = ROUNDS) -> dict:
    """Sweep `sizes` (bytes) for each collective; this rank's times and checks.

    `raw` is the backend's ``raw_loop`` (None: paraflow's calls only).
    A collective the library refuses becomes an entry of "unsupported" with the error.
    """
    rows, unsupported = [], []
    for collective in collectives:
        try:
            for size in sizes:
                rows += _one_size(backend, raw, collective, size, rounds)
        except (ValueError, TypeError, RuntimeError) as exc:
            if backend.world_size > 1:
                backend.barrier()  # every rank refuses alike; realign before the next one
            unsupported.append({"collective": collective, "error": str(exc)[:200]})
    return {"world_size": backend.world_size, "device": str(backend.device), "rows": rows, "unsupported": unsupported}
