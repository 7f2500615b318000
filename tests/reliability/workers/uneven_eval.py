"""An evaluation loop over uneven shards: rank 0 has one batch more than rank 1.

Usage: <launcher> python tests/reliability/workers/uneven_eval.py BACKEND
Each batch allreduces (loss sum, count); after its loop each rank allgathers its accuracy. So rank
0's last allreduce meets rank 1's allgather: the collectives do not match. Every rank prints
``EVENT {"rank", "start"}`` before the loop and ``EVENT {"rank", "error", "message", "time"}``
if an error leaves it, then re-raises it.
"""

import sys
import time

import torch
from report import emit

import paraflow


def main(name: str) -> None:
    with paraflow.init(name) as backend:
        batches = 3 if backend.rank == 0 else 2
        total = torch.zeros(2)
        emit({"rank": backend.rank, "start": time.time()})
        try:
            for _ in range(batches):
                total += backend.allreduce(torch.tensor([0.5, 1.0]), op="sum")  # the per-batch reduction
            backend.allgather(torch.tensor([0.9]))  # the accuracy, once per rank
        except paraflow.ParaflowError as exc:
            emit({"rank": backend.rank, "error": type(exc).__name__, "message": str(exc), "time": time.time()})
            raise
        emit({"rank": backend.rank, "error": None})


if __name__ == "__main__":
    main(sys.argv[1])
