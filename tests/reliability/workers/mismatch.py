"""Call collectives whose inputs disagree across ranks, one case after another.

Usage: <launcher> python tests/reliability/workers/mismatch.py BACKEND [--unchecked] [CASE ...]   (default: every case)

Rank 0 and the other ranks pass different inputs in each case, with the cross-rank check on
(``--unchecked``: off, so only the library and the check at the end of the job see them). Every rank prints one
``EVENT {json}`` line per case: the outcome ("error" or "ok"), the error's type and message
and the seconds the call took. A final matching allreduce shows the job is still usable.
"""

import sys
import time

import torch
from report import emit

import paraflow


def _ones(shape, dtype=torch.float32):
    return torch.ones(shape, dtype=dtype)


# case -> (what rank 0 calls, what every other rank calls); each takes the backend.
CASES = {
    "allreduce-shape": (lambda b: b.allreduce(_ones(3), op="sum"), lambda b: b.allreduce(_ones(4), op="sum")),
    "allreduce-ndim": (lambda b: b.allreduce(_ones(4), op="sum"), lambda b: b.allreduce(_ones((2, 2)), op="sum")),
    "allreduce-dtype": (
        lambda b: b.allreduce(_ones(4), op="sum"),
        lambda b: b.allreduce(_ones(4, torch.float64), op="sum"),
    ),
    "allreduce-op": (lambda b: b.allreduce(_ones(4), op="sum"), lambda b: b.allreduce(_ones(4), op="max")),
    "broadcast-shape": (lambda b: b.broadcast(_ones(3)), lambda b: b.broadcast(_ones(4))),
    "broadcast-ndim": (lambda b: b.broadcast(_ones(4)), lambda b: b.broadcast(_ones((2, 2)))),
    "broadcast-dtype": (lambda b: b.broadcast(_ones(4)), lambda b: b.broadcast(_ones(4, torch.int32))),
    "broadcast-src": (lambda b: b.broadcast(_ones(4), src=0), lambda b: b.broadcast(_ones(4), src=1)),
    "allgather-shape": (lambda b: b.allgather(_ones(3)), lambda b: b.allgather(_ones(4))),
    "allgather-ndim": (lambda b: b.allgather(_ones(4)), lambda b: b.allgather(_ones((2, 2)))),
    "allgather-dtype": (lambda b: b.allgather(_ones(4)), lambda b: b.allgather(_ones(4, torch.float64))),
    "allreduce-vs-broadcast": (lambda b: b.allreduce(_ones(4), op="sum"), lambda b: b.broadcast(_ones(4))),
    "allreduce-vs-barrier": (lambda b: b.allreduce(_ones(4), op="sum"), lambda b: b.barrier()),
    "allgather-vs-broadcast": (lambda b: b.allgather(_ones(4)), lambda b: b.broadcast(_ones(4))),
}


def main(name: str, cases: list) -> None:
    checked = "--unchecked" not in cases
    cases = [case for case in cases if case != "--unchecked"]
    with paraflow.init(name, check_collectives=checked) as backend:
        for case in cases or list(CASES):
            call = CASES[case][0 if backend.rank == 0 else 1]
            start = time.perf_counter()
            try:
                call(backend)
                outcome, kind, message = "ok", None, None
            except Exception as exc:  # noqa: BLE001 - reported to the test
                outcome, kind, message = "error", type(exc).__name__, str(exc)
            emit(
                {
                    "rank": backend.rank,
                    "case": case,
                    "outcome": outcome,
                    "type": kind,
                    "message": message,
                    "seconds": time.perf_counter() - start,
                }
            )
        total = backend.allreduce(torch.tensor([1.0]), op="sum").item()
        dist = torch.distributed
        level = str(dist.get_debug_level()) if dist.is_available() and dist.is_initialized() else None
        emit({"rank": backend.rank, "case": "final", "outcome": "ok", "sum": total, "torch_debug_level": level})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
