"""Every public collective: exact results, and how many library collectives it costs.

Usage: <launcher> python tests/workers/collective_paths.py BACKEND OUT
For each length, rank r contributes (r + 1) * (i % 7 - 3) at element i; every result is
compared here element by element with the value computed by hand, once without the cross-rank
check and once with it. Then 24 mixed public calls from six lines run with the check off and
with it on, counting the library's own collectives around them (the process group's sequence
number under torch.distributed; None elsewhere). First of all, each public collective is traced
with sys.setprofile from the call until the library's own collective is entered: which paraflow
files ran on the way. Everything goes to OUT/rank<R>.json.
"""

import json
import os
import sys
from pathlib import Path

import torch

import paraflow

LENGTHS = (3, 1024, 5000)
MIXED_ROUNDS = 4  # six public calls each


def values(rank: int, n: int) -> torch.Tensor:
    return ((torch.arange(n) % 7 - 3) * (rank + 1)).to(torch.float32)


def wrong(got, want) -> int:
    return int(want.numel()) if got.shape != want.shape else int((got != want).sum())


#: Where each library's collectives begin: torch.distributed's functions, horovod's enqueues.
LIBRARY_CALLS = {
    "distributed_c10d.py": {"all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "barrier"},
    "mpi_ops.py": {"allreduce_async_", "broadcast_async_", "allgather_async", "barrier"},
}


def paraflow_files_on_the_way(call) -> dict:
    """The paraflow files whose functions run from `call()` until the library's collective is
    entered, and whether it was (sys.setprofile sees every Python function call)."""
    package = os.path.dirname(paraflow.__file__) + os.sep
    files, reached = set(), []

    def profile(frame, event, _):
        if reached or event != "call":
            return
        path = frame.f_code.co_filename
        if frame.f_code.co_name in LIBRARY_CALLS.get(os.path.basename(path), ()):
            reached.append(frame.f_code.co_name)
        elif path.startswith(package):
            files.add(path[len(package) :])

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return {"files": sorted(files), "library": reached[:1]}


def traced(backend) -> dict:
    """Each public collective's way to the library, on its first call from its line (nothing cached)."""
    x = torch.ones(4)
    return {
        "allreduce": paraflow_files_on_the_way(lambda: backend.allreduce(x)),
        "allreduce_": paraflow_files_on_the_way(lambda: backend.allreduce_(x)),
        "broadcast": paraflow_files_on_the_way(lambda: backend.broadcast(x)),
        "broadcast_": paraflow_files_on_the_way(lambda: backend.broadcast_(x)),
        "allgather": paraflow_files_on_the_way(lambda: backend.allgather(x)),
        "barrier": paraflow_files_on_the_way(backend.barrier),
    }


def exact(backend) -> dict:
    world, rank = backend.world_size, backend.rank
    results = {}
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
    return results


def mixed_calls(backend) -> None:
    """24 public calls from six lines of this file."""
    for i in range(MIXED_ROUNDS):
        backend.allreduce(torch.ones(8), op="sum")
        backend.allreduce_(torch.ones(1000 + i), op="max")
        backend.broadcast(torch.ones(3, 4), src=1)
        backend.broadcast_(torch.ones(16, dtype=torch.int64), src=0)
        backend.allgather(torch.ones(5))
        backend.barrier()


def library_collectives(backend):
    """A function counting the library collectives so far, or None where it cannot be read."""
    if not backend.name.startswith(("ddp", "fsdp")):
        return None
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_group()._get_sequence_number_for_group


def count(backend, counter) -> dict:
    made_before = backend.collective_count
    before = counter() if counter else None
    mixed_calls(backend)
    return {
        "public": backend.collective_count - made_before,
        "library": counter() - before if counter else None,
    }


def main(name: str, out: Path) -> None:
    with paraflow.init(name) as backend:
        assert not backend.check_collectives
        counter = library_collectives(backend)
        results = {"traced": traced(backend), "plain": exact(backend), "count/plain": count(backend, counter)}
        backend.check_collectives = True
        results["checked"] = exact(backend)
        results["count/checked"] = count(backend, counter)
        results["final"] = backend.allreduce(torch.ones(2), op="sum").tolist()
        results["rank"] = backend.rank
    (out / f"rank{backend.rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
