"""A repeated mid-sized allreduce whose cross-rank check rides along: on the shared-memory board
(paraflow/reliability/check_board.py) or, with PARAFLOW_SHARED_CHECK=0, bundled into the
allreduce (check_bundle.py).

Usage: torchrun --nproc_per_node 2 tests/workers/repeated_call.py OUT [BACKEND]
   or: horovodrun -np 2 --gloo python tests/workers/repeated_call.py OUT horovod
Every result is compared element by element with the value computed by hand; OUT/rank<R>.json
holds the counts of wrong elements, how many calls went each way, and the mismatch outcomes.
"""

import json
import sys
from pathlib import Path

import torch

import paraflow
from paraflow.reliability import check_board, check_bundle, check_exchange

N = 5000  # 20 KB in float32: above what rides in the frame, below BUNDLE_MAX_BYTES
CALLS = check_bundle.BUNDLE_AFTER + 4
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64, "int64": torch.int64}
counts = {"bundled": 0, "boarded": 0}


def count(name: str, key: str, mine) -> None:
    """Count calls of check_exchange.`name` in which this rank's call was the repeated one."""
    original = getattr(check_exchange, name)

    def counting(*args, **kwargs):
        counts[key] += mine(args) is not None
        return original(*args, **kwargs)

    setattr(check_exchange, name, counting)


def count_short_path() -> None:
    """Count the repeated calls that took the short path (Collectives._repeat): it posts packed descriptors."""
    original = check_board.CheckBoard.post_packed

    def counting(self, *args):
        counts["boarded"] += 1
        return original(self, *args)

    check_board.CheckBoard.post_packed = counting


def values(rank: int, call: int, dtype) -> torch.Tensor:
    return ((torch.arange(N) % 11 - 5) * (rank + 1) + call).to(dtype)


def wrong(got, want) -> int:
    return int(want.numel()) if got.shape != want.shape else int((got != want).sum())


def expected(op, rows):
    stacked = torch.stack(rows)
    if op == "sum":
        return stacked.sum(0, dtype=rows[0].dtype) if rows[0].dtype != torch.bfloat16 else sum(rows)
    if op == "mean":
        return sum(rows) / len(rows)
    return stacked.max(0).values if op == "max" else stacked.min(0).values


def main(out: Path, name: str) -> None:
    count("bundled", "bundled", lambda args: args[3])
    count("on_board", "boarded", lambda args: args[4])
    count_short_path()
    results = {"wrong": {}}
    dtypes = {k: v for k, v in DTYPES.items() if not (name == "horovod" and k == "bfloat16")}  # horovod 0.28: no bf16
    with paraflow.init(name) as backend:
        world, rank = backend.world_size, backend.rank
        for label, dtype in dtypes.items():
            for op in ("sum", "mean", "max", "min"):
                if op == "mean" and not dtype.is_floating_point:
                    continue
                kept, bad = [], 0
                for call in range(CALLS):
                    rows = [values(r, call, dtype) for r in range(world)]
                    x = values(rank, call, dtype)
                    if call % 2:
                        kept.append((backend.allreduce(x, op=op), expected(op, rows)))
                    else:
                        bad += wrong(backend.allreduce_(x, op), expected(op, rows))
                bad += sum(wrong(got, want) for got, want in kept)  # results returned earlier still hold
                results["wrong"][f"{label}/{op}"] = bad
        results.update(counts)
        mismatches = {}
        big, other = torch.ones(N), torch.ones(N + 1)
        cases = {  # rank 0 repeats the primed call, the others do this
            "other-shape": lambda: backend.allreduce(other),
            "barrier": backend.barrier,
            "other-op": lambda: backend.allreduce(big, op="max"),
            "small": lambda: backend.allreduce(torch.ones(3)),
        }
        want = torch.full((N,), float(world))
        for case, call in cases.items():
            for _ in range(check_bundle.BUNDLE_AFTER):
                backend.allreduce(big, op="sum")  # every rank: the run that turns bundling on
            try:
                backend.allreduce(big, op="sum") if rank == 0 else call()
                mismatches[case] = "ok"
            except paraflow.CollectiveError as exc:
                mismatches[case] = f"CollectiveError: {exc}"
            results[f"after/{case}"] = wrong(backend.allreduce(big, op="sum"), want)
        results["mismatches"] = mismatches
        before, small = counts["boarded"], torch.ones(3)  # rides in the frame until it repeats
        results["small_wrong"] = sum(
            wrong(backend.allreduce_(small.clone()), torch.full((3,), float(world))) for _ in range(CALLS)
        )
        results["small_boarded"] = counts["boarded"] - before
        try:
            backend.allreduce_(small.clone()) if rank == 0 else backend.allreduce_(torch.ones(4))
            results["small_mismatch"] = "ok"
        except paraflow.CollectiveError as exc:
            results["small_mismatch"] = f"CollectiveError: {exc}"
        for _ in range(check_bundle.BUNDLE_AFTER):
            backend.allreduce(big, op="sum")
        backend.barrier()  # every rank leaves the run at once: no error, the usual way
        results["together"] = wrong(backend.allreduce(other, op="sum"), torch.full((N + 1,), float(world)))
        results["rank"] = rank
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "ddp-gloo")
