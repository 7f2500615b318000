"""Train a float64 model with AdamW for STEPS steps, maybe resuming and saving on the way.

Usage: <launcher> python steps.py BACKEND OUT STEPS [key=value ...]
    resume=PATH      load PATH (sharded directory or full file) first; training continues from its step
    save_at=N,M      after steps N and M: backend.save(ckpt) and backend.export(ckpt + ".full.pt")
    ckpt=PATH        where save_at writes
    export_at_save=0 save only (an asynchronous save then writes while training goes on)
    kill_rank=R      rank R SIGKILLs itself while writing its shards in the second save (fsdp only)
    options=k:v;k:v  backend options (async_save:1, blocks:Linear)
Every global batch is drawn from the step number alone, and rank r of n takes rows
[r*B/n, (r+1)*B/n), so any number of ranks trains the same model. At the end every rank takes
part in backend.export(OUT) and rank 0 also writes OUT + ".json" (the step it resumed from).
"""

import json
import os
import signal
import sys

import torch
import torch.nn.functional as F

import paraflow
from paraflow.examples.models import build_model

GLOBAL_BATCH, SEED = 12, 1234  # 12 rows split evenly over 1, 2 or 3 ranks


def batch(step: int, rank: int, world: int):
    g = torch.Generator().manual_seed(SEED + step)
    x = torch.randn(GLOBAL_BATCH, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (GLOBAL_BATCH,), generator=g)
    share = GLOBAL_BATCH // world
    return x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]


def kill_during_shard_write(rank: int) -> None:
    """Make this rank die, SIGKILLed, in the middle of its next-but-one shard write."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    write, calls = FileSystemWriter.write_data, [0]

    def dying_write(self, plan, planner):
        calls[0] += 1
        if calls[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return write(self, plan, planner)

    if int(os.environ.get("RANK", "0")) == rank:
        FileSystemWriter.write_data = dying_write


def main(name: str, out: str, steps: int, args: dict) -> None:
    torch.set_default_dtype(torch.float64)
    options = dict(item.split(":", 1) for item in args.get("options", "").split(";") if item)
    if "async_save" in options:
        options["async_save"] = options["async_save"] == "1"
    if "kill_rank" in args:
        kill_during_shard_write(int(args["kill_rank"]))
    save_at = {int(s) for s in args.get("save_at", "").split(",") if s}
    with paraflow.init(name, **options) as backend:
        torch.manual_seed(SEED)
        model = backend.wrap_model(build_model("mlp", width=16))
        optimizer = backend.wrap_optimizer(torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1), model)
        progress = {"step": 0}
        state = {"model": model, "optimizer": optimizer, "progress": progress}
        if "resume" in args:
            backend.load(args["resume"], state)
            progress = state["progress"]
        resumed_from = progress["step"]
        for step in range(progress["step"], steps):
            x, y = batch(step, backend.rank, backend.world_size)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            progress["step"] = step + 1
            if step + 1 in save_at:
                backend.save(args["ckpt"], state)
                if args.get("export_at_save", "1") == "1":
                    backend.export(args["ckpt"] + ".full.pt", state)
        backend.export(out, state)
        if backend.is_main:
            with open(out + ".json", "w") as f:
                json.dump({"resumed_from": resumed_from, "world_size": backend.world_size}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), dict(a.split("=", 1) for a in sys.argv[4:]))
