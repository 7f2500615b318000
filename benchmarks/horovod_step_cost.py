"""Measure what paraflow adds to a horovod training step, against raw horovod.torch in one run.

Usage: mpirun -np N python benchmarks/horovod_step_cost.py [MODEL] [PAIRS] [ROUNDS]
Runs the benchmark's abstraction-overhead loop (paraflow.bench.rank.overhead: the same step through
paraflow and through raw horovod.torch, interleaved, the order flipped every pair) ROUNDS times
and prints, on rank 0, the median step of each side and the median of the per-pair ratios
paraflow / raw - 1 (a step takes as long as its slowest rank), with a 95 % interval from order
statistics.
"""

import math
import statistics
import sys

import numpy as np
from mpi4py import MPI  # owns MPI, so horovod can start once per round

import paraflow
from paraflow.bench.model_spec import ModelSpec
from paraflow.bench.rank.overhead import run_overhead


def interval(values: list) -> tuple:
    """Distribution-free 95 % interval of the median (order statistics)."""
    ordered, n = sorted(values), len(values)
    half = 1.96 * math.sqrt(n) / 2
    return ordered[max(0, int(n / 2 - half))], ordered[min(n - 1, int(math.ceil(n / 2 + half)))]


def main(model: str, pairs: int, rounds: int) -> None:
    ratios, paraflow_s, raw_s = [], [], []
    for _ in range(rounds):
        with paraflow.init("horovod") as backend:
            result = run_overhead(backend, ModelSpec.parse(model), "synthetic", 32, 20, pairs, seed=0)
        mine = np.array([result["paraflow_step_s"], result["raw_step_s"]], dtype=np.float64)
        slowest = np.empty_like(mine)
        MPI.COMM_WORLD.Allreduce(mine, slowest, op=MPI.MAX)  # a step lasts as long as its slowest rank
        rank = MPI.COMM_WORLD.Get_rank()
        paraflow_s += slowest[0].tolist()
        raw_s += slowest[1].tolist()
        ratios += (slowest[0] / slowest[1] - 1).tolist()
    if rank == 0:
        low, high = interval(ratios)
        medians = statistics.median(paraflow_s) * 1e3, statistics.median(raw_s) * 1e3
        print(
            f"{model} ranks={result['world_size']} pairs={len(ratios)}: paraflow {medians[0]:.3f} ms"
            f"  raw {medians[1]:.3f} ms  paired {statistics.median(ratios):+.2%}"
            f" (95% {low:+.2%} .. {high:+.2%})",
            flush=True,
        )


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        args[0] if args else "mlp:width=1024",
        int(args[1]) if len(args) > 1 else 300,
        int(args[2]) if len(args) > 2 else 1,
    )
