"""Rank 1 stops answering (SIGSTOP) at the start of one phase; the other ranks go on.

Usage: <launcher> python tests/reliability/workers/phases.py BACKEND PHASE DIR
PHASE: wrap_model, wrap_optimizer (then one training step), save (in the middle of a sharded
checkpoint save, as rank 1 starts writing its shards) or shutdown (right before leaving
``with paraflow.init()``). Every rank writes DIR/rank<R>.pid at start, and prints ``EVENT {json}``
lines: the stop, any error that leaves the ``with`` block (type, message, time), ``done``.
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


def stop_while_writing_shards(stop) -> None:
    """Call `stop` when this rank starts writing its checkpoint shards (torch.distributed.checkpoint)."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    write = FileSystemWriter.write_data

    def stopping_write(self, *args, **kwargs):
        stop()
        return write(self, *args, **kwargs)

    FileSystemWriter.write_data = stopping_write


def main(name: str, phase: str, directory: str) -> None:
    rank = -1
    try:
        with paraflow.init(name) as backend:
            rank = backend.rank
            (Path(directory) / f"rank{rank}.pid").write_text(str(os.getpid()))

            def maybe_stop(here: str) -> None:
                if rank == 1 and phase == here:
                    emit({"rank": rank, "fault": "stop", "phase": here, "time": time.time()})
                    os.kill(os.getpid(), signal.SIGSTOP)

            torch.manual_seed(0)
            maybe_stop("wrap_model")
            model = backend.wrap_model(build_model("mlp", width=16))
            maybe_stop("wrap_optimizer")
            optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05), model)
            x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            if phase == "save":
                stop_while_writing_shards(lambda: maybe_stop("save"))
                backend.save(str(Path(directory) / "checkpoint"), {"model": model, "optimizer": optimizer})
            maybe_stop("shutdown")
        emit({"rank": rank, "done": True, "time": time.time()})
    except BaseException as exc:
        emit({"rank": rank, "error": type(exc).__name__, "message": str(exc), "time": time.time()})
        raise


if __name__ == "__main__":
    main(*sys.argv[1:4])
