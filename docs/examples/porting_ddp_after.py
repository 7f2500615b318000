"""porting_ddp_before.py on paraflow: the same training under any backend and launcher.

python docs/examples/porting_ddp_after.py --spawn 2 --backend ddp-gloo     # as mp.spawn did
paraflow run -n 2 --backend horovod docs/examples/porting_ddp_after.py     # or any launcher
# stop half-way under fsdp, resume under another backend from the same checkpoint:
paraflow run -n 2 --backend fsdp docs/examples/porting_ddp_after.py --checkpoint ckpt --stop-after 4
paraflow run -n 2 --backend ddp-gloo docs/examples/porting_ddp_after.py --checkpoint ckpt
"""

import argparse
import os

import torch
import torch.nn.functional as F
from porting_common import batch, build_model  # the model and data, the same in every example

import paraflow

STEPS, MICRO = 8, 2


def train(backend: paraflow.Backend, checkpoint: str = "", stop_after: int = 0) -> None:
    model = backend.wrap_model(build_model())
    optimizer = backend.wrap_optimizer(torch.optim.AdamW(model.parameters(), lr=0.01), model)
    state = {"model": model, "optimizer": optimizer, "step": 0}
    if checkpoint and os.path.exists(checkpoint):
        backend.load(checkpoint, state)  # written under any backend, at any world size
        if backend.is_main:
            print(f"resumed at step {state['step']} under {backend.name}")
    # --8<-- [start:loop]
    for step in range(state["step"], STEPS):
        x, y = batch(step, backend.rank, backend.world_size)
        for k, (xs, ys) in enumerate(zip(x.chunk(MICRO), y.chunk(MICRO))):
            if k < MICRO - 1:
                with backend.no_sync(model):  # decided at the forward, on every backend
                    loss = F.cross_entropy(model(xs), ys) / MICRO
            else:
                loss = F.cross_entropy(model(xs), ys) / MICRO
            loss.backward()
        backend.clip_grad_norm_(model, 0.5)  # the reduced gradient, on every backend
        optimizer.step()
        optimizer.zero_grad()
        # --8<-- [end:loop]
        state["step"] = step + 1
        if checkpoint and state["step"] == stop_after:
            backend.save(checkpoint, state)  # fsdp: a directory of shards; others: one file
            if backend.is_main:
                print(f"saved at step {state['step']} under {backend.name}")
            return
    weights = backend.unwrap(model).state_dict()
    weights = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in weights.items()}  # fsdp's shards
    if backend.is_main:
        print(f"weights sum {sum(v.double().sum().item() for v in weights.values()):.12f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawn", type=int, default=0, help="start this many processes here, as mp.spawn does")
    parser.add_argument("--backend", default=None, help="with --spawn: the backend (default ddp)")
    parser.add_argument("--checkpoint", default="", help="resume from it if it exists; --stop-after saves it")
    parser.add_argument("--stop-after", type=int, default=0, help="save the checkpoint after this step and stop")
    args = parser.parse_args()
    if args.spawn:  # this process starts the ranks, as mp.spawn does
        paraflow.launch(train, args.checkpoint, args.stop_after, nprocs=args.spawn, backend=args.backend or "ddp")
    else:  # started by a launcher (paraflow run, torchrun, mpirun, srun), or one process
        with paraflow.init() as backend:
            train(backend, args.checkpoint, args.stop_after)
