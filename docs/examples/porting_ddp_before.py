"""A plain PyTorch DDP script as the tutorials write it: `python docs/examples/porting_ddp_before.py`.

mp.spawn starts 2 processes; each joins a gloo process group, wraps the model in DDP, accumulates
2 micro-batches per step (DDP's no_sync around the first forward), clips the gradient and steps.
"""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from porting_common import batch, build_model  # the model and data, the same in every example
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD, STEPS, MICRO = 2, 8, 2


def train(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = DDP(build_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x, y = batch(step, rank, world)
        for k, (xs, ys) in enumerate(zip(x.chunk(MICRO), y.chunk(MICRO))):
            if k < MICRO - 1:
                with model.no_sync():  # DDP decides at the forward: this backward is not reduced
                    loss = F.cross_entropy(model(xs), ys) / MICRO
            else:
                loss = F.cross_entropy(model(xs), ys) / MICRO
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad()
    if rank == 0:
        print(f"weights sum {sum(p.double().sum().item() for p in model.module.parameters()):.12f}")
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    mp.spawn(train, args=(WORLD, free_port()), nprocs=WORLD)
