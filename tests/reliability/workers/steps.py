"""Ranks train a small model step by step; one rank can be made to fail on purpose.

Usage: <launcher> python tests/reliability/workers/steps.py BACKEND STEPS [FAULT RANK STEP]

FAULT, done by rank RANK at step STEP (counted from 1):
    kill   SIGKILL itself between the forward and the backward pass
    exit   sys.exit(3) at the same point
    raise  raise an exception in the middle of the step
    stop   SIGSTOP itself right before the step's allreduce
    skip   leave out the step's allreduce, then idle far past the timeout
    none   no fault (the default)
Every step runs a forward and backward pass (gradients synchronised by the backend) and
``backend.allreduce`` of the loss. Every rank prints ``EVENT {json}`` lines on stdout: the fault
it is about to do, any error that leaves ``main`` (type, message, wall time), and ``done``.
"""

import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from report import emit
from torch.distributed.elastic.multiprocessing.errors import record

import paraflow
from paraflow.examples.models import build_model


def event(**fields) -> None:
    """One machine-readable line for the test, flushed at once."""
    emit({**fields, "time": time.time()})


class InjectedFailure(RuntimeError):
    """The exception a rank raises on purpose."""


@record
def main(name: str, steps: int, fault: str = "none", fault_rank: int = -1, fault_step: int = -1) -> None:
    rank = -1
    try:
        with paraflow.init(name) as backend:
            rank = backend.rank
            torch.manual_seed(0)
            model = backend.wrap_model(build_model("mlp", width=16))
            optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05), model)
            for step in range(1, steps + 1):
                mine = rank == fault_rank and step == fault_step
                x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                if mine and fault == "kill":
                    event(rank=rank, fault="kill", step=step)
                    os.kill(os.getpid(), signal.SIGKILL)
                if mine and fault == "exit":
                    event(rank=rank, fault="exit", step=step)
                    sys.exit(3)
                if mine and fault == "raise":
                    event(rank=rank, fault="raise", step=step)
                    raise InjectedFailure(f"injected failure on rank {rank} at step {step}")
                loss.backward()
                optimizer.step()
                if mine and fault == "stop":
                    event(rank=rank, fault="stop", step=step)
                    os.kill(os.getpid(), signal.SIGSTOP)
                if mine and fault == "skip":
                    event(rank=rank, fault="skip", step=step)
                    time.sleep(backend.timeout + 60)
                    continue
                backend.allreduce(loss.detach(), op="mean")
            event(rank=rank, done=True, steps=steps)
    except BaseException as exc:
        event(rank=rank, error=type(exc).__name__, message=str(exc), paraflow=isinstance(exc, paraflow.ParaflowError))
        raise


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], int(args[1]), *(args[2:3]), *(int(a) for a in args[3:5]))
