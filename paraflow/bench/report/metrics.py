"""Benchmark formulas, kept apart so each can be checked against hand-computed numbers.

Units: seconds in, seconds out; bandwidths in bytes per second (divide by 1e9 for GB/s:
GB = 1e9 bytes throughout).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "percentile",
    "slowest_rank_per_step",
    "throughput",
    "communication_overhead",
    "bus_factor",
]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks: numpy's."""
    if not values:
        raise ValueError("percentile of no values")
    return float(np.percentile(values, q))


def slowest_rank_per_step(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """A step takes as long as its slowest rank: element-wise max over ranks' step times."""
    if not per_rank:
        return []
    lengths = {len(times) for times in per_rank}
    if len(lengths) != 1:
        raise ValueError(f"ranks timed different numbers of steps: {sorted(lengths)}")
    return [max(column) for column in zip(*per_rank)]


def throughput(samples: int, window_s: float) -> float:
    """Samples per second: global samples processed in the window / the window's wall time."""
    if window_s <= 0:
        raise ValueError(f"window of {window_s} s")
    return samples / window_s


def communication_overhead(t_no_sync: float, t_sync: float) -> float:
    """1 - t_step(no gradient sync) / t_step(with it): the share of a step spent on gradient sync."""
    return 1.0 - t_no_sync / t_sync


def bus_factor(n: int, collective: str = "allreduce") -> float:
    """nccl-tests' bus factor: how often each byte crosses the slowest link.

    allreduce 2(n-1)/n; allgather and reduce_scatter (n-1)/n (size = the whole gathered output,
    or the whole scattered input); broadcast 1.
    """
    factors = {
        "allreduce": 2.0 * (n - 1) / n,
        "allgather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "broadcast": 1.0,
    }
    if collective not in factors:
        raise ValueError(f"no bus factor for {collective!r}")
    return factors[collective]
