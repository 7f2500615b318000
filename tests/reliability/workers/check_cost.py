"""Measure what paraflow's cross-rank check costs per collective (for the README's numbers).

Usage: <launcher> python tests/reliability/workers/check_cost.py BACKEND [REPEATS]
For each size, times ``backend.allreduce`` (checked) against the backend's own ``_allreduce``
(unchecked) in alternating rounds after a warm-up; rank 0 prints the medians in microseconds.
Set PARAFLOW_DEBUG=1 to time debug mode.
"""

import statistics
import sys
import time

import torch

import paraflow

SIZES = (1, 1_000, 1_000_000)  # float32 elements


def per_call_us(call, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats * 1e6


def main(name: str, repeats: int) -> None:
    with paraflow.init(name) as backend:
        for size in SIZES:
            x = torch.ones(size)
            n = max(5, repeats // max(1, size // 1000))
            checked = lambda x=x: backend.allreduce(x, op="sum")  # noqa: E731
            unchecked = lambda x=x: backend._allreduce(x.clone(), "sum")  # noqa: E731
            for call in (checked, unchecked):
                per_call_us(call, max(2, n // 10))  # warm-up
            rounds = [(per_call_us(checked, n), per_call_us(unchecked, n)) for _ in range(7)]
            backend.barrier()
            if backend.is_main:
                with_check = statistics.median(r[0] for r in rounds)
                without = statistics.median(r[1] for r in rounds)
                print(
                    f"{name} {size:>9} float32: checked {with_check:9.1f} us  unchecked {without:9.1f} us  "
                    f"check costs {with_check - without:8.1f} us ({with_check / without - 1:+.0%})",
                    flush=True,
                )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 400)
