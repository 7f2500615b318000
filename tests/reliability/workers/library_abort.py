"""The communication library aborts one rank's process; the others' output must say where each rank was.

Usage: mpirun -np 2 python tests/reliability/workers/library_abort.py BACKEND FAULT DIR
FAULT:
    abort         rank 0's process gets SIGABRT inside the library call of the allreduce of step 2
                  (what ``std::terminate`` does to a C++ exception gloo or NCCL throws)
    skip-in-save  rank 1 leaves out the first collective of the save after step 2 (an allgather):
                  its next one, with another size, meets rank 0's, and gloo aborts rank 0
Every step runs a forward and backward pass and ``backend.allreduce`` of the loss. Every rank
prints ``EVENT {json}`` lines: the fault, any error that leaves ``main``, and ``done``.
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from report import emit

import paraflow
from paraflow.examples.models import build_model


def abort_in_library(backend) -> None:
    """Make rank 0's next library allreduce end the process with SIGABRT."""

    def aborting(tensor, op):
        emit({"rank": backend.rank, "fault": "abort", "time": time.time()})
        os.kill(os.getpid(), signal.SIGABRT)

    backend._allreduce = aborting


def skip_first_collective(backend) -> None:
    """Make this rank's next public allgather return at once, as if every rank had sent its own tensor."""
    gather = backend.allgather

    def skipping(tensor):
        backend.allgather = gather
        emit({"rank": backend.rank, "fault": "skip-in-save", "time": time.time()})
        return [tensor.clone() for _ in range(backend.world_size)]

    backend.allgather = skipping


def main(name: str, fault: str, directory: str) -> None:
    rank = -1
    try:
        with paraflow.init(name) as backend:
            rank = backend.rank
            torch.manual_seed(0)
            model = backend.wrap_model(build_model("mlp", width=16))
            optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05), model)
            for step in range(1, 4):
                x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                if fault == "abort" and rank == 0 and step == 2:
                    abort_in_library(backend)
                backend.allreduce(loss.detach())
                if step == 2:
                    if fault == "skip-in-save" and rank == 1:
                        skip_first_collective(backend)
                    backend.save(str(Path(directory) / "checkpoint.pt"), {"model": model})
        emit({"rank": rank, "done": True, "time": time.time()})
    except BaseException as exc:
        emit({"rank": rank, "error": type(exc).__name__, "message": str(exc)[:2000], "time": time.time()})
        raise


if __name__ == "__main__":
    main(*sys.argv[1:4])
