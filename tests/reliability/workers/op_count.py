"""Count the communication operations of 20 training steps, with paraflow's stall watch and without.

Usage: <launcher> python tests/reliability/workers/op_count.py BACKEND
The same 20 steps of the same model run twice: through paraflow (markers on the model and the
optimizer, the stall watch with a 0.5 s threshold, and rank 0 pausing 2 s before step 10 so a
whole stall round runs inside the window), then on the raw library set up by hand (torch DDP
on the same process group, or horovod's own DistributedOptimizer), where nothing of paraflow's
runs. Counted: DDP, the gloo process group's sequence number (one per operation); horovod,
calls into its collective operations. Each rank prints ``EVENT {"rank", "paraflow", "raw"}``.
"""

import copy
import os
import sys
import time

import torch
import torch.nn.functional as F
from report import emit

import paraflow

STEPS, PAUSE_AT, PAUSE_S = 20, 10, 2.0


def horovod_counter():
    """Count every call into horovod's collective operations (their private entry points)."""
    import horovod.torch as hvd
    import horovod.torch.mpi_ops as ops

    calls = [0]
    names = [n for n in dir(ops) if n.startswith(("_allreduce", "_grouped_", "_allgather", "_broadcast", "_alltoall"))]
    names += [n for n in ("_reducescatter_async", "barrier", "join") if hasattr(ops, n)]
    for name in names:
        original = getattr(ops, name)
        if callable(original):

            def counted(*args, _original=original, **kwargs):
                calls[0] += 1
                return _original(*args, **kwargs)

            setattr(ops, name, counted)
            if name in ("barrier", "join"):
                setattr(hvd, name, counted)
    return lambda: calls[0]


def process_group_counter():
    import torch.distributed as dist

    group = dist.distributed_c10d._get_default_group()
    return group._get_sequence_number_for_group


def steps(model, optimizer, rank: int) -> None:
    data = torch.Generator().manual_seed(rank)
    for step in range(1, STEPS + 1):
        if step == PAUSE_AT and rank == 0:
            time.sleep(PAUSE_S)
        x, y = torch.randn(16, 8, generator=data), torch.randint(0, 4, (16,), generator=data)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def raw(name: str, model: torch.nn.Module):
    """The same model and optimizer set up on the raw library, no paraflow object involved."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if name == "horovod":
        import horovod.torch as hvd

        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model, hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model), optimizer


def main(name: str) -> None:
    with paraflow.init(name, stall_threshold=0.5) as backend:
        count = horovod_counter() if name == "horovod" else process_group_counter()
        torch.manual_seed(0)
        base = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        model = backend.wrap_model(copy.deepcopy(base))
        optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        backend.barrier()
        before = count()
        steps(model, optimizer, backend.rank)
        through_paraflow = count() - before
        raw_model, raw_optimizer = raw(name, copy.deepcopy(base))
        backend.barrier()
        before = count()
        steps(raw_model, raw_optimizer, backend.rank)
        on_raw = count() - before
        emit({"rank": backend.rank, "paraflow": through_paraflow, "raw": on_raw, "pid": os.getpid()})
        backend.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
