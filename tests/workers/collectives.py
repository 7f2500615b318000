"""Run every collective on this rank's own values and write the results to OUT/rank<R>.json.

Usage: <launcher> python tests/workers/collectives.py BACKEND OUT
Rank r contributes tensors built from r, so the test can compute every expected result by hand.
"""

import json
import sys
from pathlib import Path

import torch

import paraflow

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}


def contribution(rank: int, dtype: torch.dtype) -> torch.Tensor:
    """[r+1, 2r-3, 10r] for rank r."""
    return torch.tensor([rank + 1, 2 * rank - 3, 10 * rank], dtype=dtype)


def main(name: str, out: Path) -> None:
    results = {}
    with paraflow.init(name) as backend:
        for label, dtype in DTYPES.items():
            x = contribution(backend.rank, dtype)
            before = x.clone()
            ops = ["sum", "min", "max"] + (["mean"] if dtype.is_floating_point else [])
            for op in ops:
                y = backend.allreduce(x, op=op)
                results[f"allreduce/{op}/{label}"] = [y.tolist(), str(y.dtype)]
            for src in range(backend.world_size):
                results[f"broadcast/{src}/{label}"] = backend.broadcast(x, src=src).tolist()
            results[f"allgather/{label}"] = [t.tolist() for t in backend.allgather(x)]
            results[f"unchanged/{label}"] = torch.equal(x, before)
            backend.barrier()
        results["meta"] = {"rank": backend.rank, "world_size": backend.world_size, "name": backend.name}
    (out / f"rank{results['meta']['rank']}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
