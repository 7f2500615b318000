"""Both ways a public collective travels: inside the check's frame (small) and on its own (large).

Usage: <launcher> python tests/workers/collective_paths.py BACKEND OUT
For each length, rank r contributes (r + 1) * (i % 7 - 3) at element i; every result is
compared here element by element with the value computed by hand, and the counts of wrong
elements go to OUT/rank<R>.json. Then mismatches across the two paths must fail on every rank
and leave the job usable.
"""

import json
import sys
from pathlib import Path

import torch

import paraflow
from paraflow.reliability.collective_check import CARRY_BYTES

LENGTHS = (3, CARRY_BYTES // 4, CARRY_BYTES // 4 + 1, 5000)  # carried, the largest carried, the smallest not


def values(rank: int, n: int) -> torch.Tensor:
    return ((torch.arange(n) % 7 - 3) * (rank + 1)).to(torch.float32)


def wrong(got, want) -> int:
    return int(want.numel()) if got.shape != want.shape else int((got != want).sum())


def main(name: str, out: Path) -> None:
    results = {}
    with paraflow.init(name) as backend:
        world, rank = backend.world_size, backend.rank
        for n in LENGTHS:
            rows = [values(r, n) for r in range(world)]
            x = values(rank, n)
            before = x.clone()
            checks = {
                "allreduce/sum": wrong(backend.allreduce(x, op="sum"), sum(rows)),
                "allreduce/mean": wrong(backend.allreduce(x, op="mean"), sum(rows) / world),
                "allreduce/max": wrong(backend.allreduce(x, op="max"), torch.stack(rows).max(0).values),
                "allreduce/min": wrong(backend.allreduce(x, op="min"), torch.stack(rows).min(0).values),
                "broadcast": wrong(backend.broadcast(x, src=1), rows[1]),
                "allgather": sum(wrong(g, w) for g, w in zip(backend.allgather(x), rows)),
                "unchanged": wrong(x, before),
                "allreduce_": wrong(backend.allreduce_(x.clone(), "sum"), sum(rows)),
                "broadcast_": wrong(backend.broadcast_(x.clone(), src=1), rows[1]),
            }
            in_place = x.clone()
            backend.allreduce_(in_place, "sum")
            checks["allreduce_/in place"] = wrong(in_place, sum(rows))
            results[str(n)] = checks
        mismatches = {}
        small, large, other = torch.ones(3), torch.ones(5000), torch.ones(6000)
        cases = {  # (rank 0's call, the other ranks' call)
            "carried-vs-not": (lambda: backend.allreduce(small), lambda: backend.allreduce(large)),
            "not-vs-carried-broadcast": (lambda: backend.broadcast(large), lambda: backend.allgather(small)),
            # after the same call on every rank, rank 0 repeats it: it starts before the check
            "repeated-vs-other-shape": (lambda: backend.allreduce(large), lambda: backend.allreduce(other)),
            "repeated-vs-barrier": (lambda: backend.allreduce_(large.clone()), backend.barrier),
            "repeated-allgather-vs-small": (lambda: backend.allgather(large), lambda: backend.allreduce(small)),
        }
        expected = sum(values(r, 5000) for r in range(world))
        for case, calls in cases.items():
            if case.startswith("repeated"):
                calls[0]()  # every rank: agreed
                results[f"primed/{case}"] = getattr(backend, "_last_agreed", None) is not None
            try:
                calls[0 if rank == 0 else 1]()
                mismatches[case] = "ok"
            except paraflow.CollectiveError as exc:
                mismatches[case] = f"CollectiveError: {exc}"
            results[f"after/{case}"] = wrong(backend.allreduce(values(rank, 5000), op="sum"), expected)
        results["mismatches"] = mismatches
        results["final"] = backend.allreduce(torch.ones(2), op="sum").tolist()
        results["rank"] = rank
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
