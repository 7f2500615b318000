"""Train a small model under any paraflow backend; the loop is the same for every one.

Launch commands (N processes):
    python train.py --backend single                        # baseline: no wrapper
    python train.py --backend dp                            # nn.DataParallel, all visible GPUs
    torchrun --nproc_per_node N train.py --backend ddp      # NCCL with GPUs, else gloo
    mpirun -np N python train.py --backend ddp-gloo         # DDP under MPI (needs mpi4py)
    mpirun -np N python train.py --backend horovod          # Horovod, MPI controller
    horovodrun -np N -H localhost:N --gloo python train.py --backend horovod
    srun -n N python train.py --backend ddp                 # SLURM
As root, mpirun needs --allow-run-as-root; more ranks than cores needs --oversubscribe.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset

import paraflow
from paraflow.data import DATASETS, load_dataset
from paraflow.models import MODELS, build_model, count_parameters


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=paraflow.registered_names(), default=None,
                   help="default: PARAFLOW_BACKEND, else ddp under a launcher, else single")
    p.add_argument("--model", choices=list(MODELS), default="mlp")
    p.add_argument("--data", choices=DATASETS, default="digits")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None, help="rank 0 writes a result summary here")
    return p.parse_args(argv)


def evaluate(backend: paraflow.Backend, model: torch.nn.Module, dataset) -> float:
    """Held-out accuracy: each rank scores every world_size-th sample, counts are summed."""
    shard = Subset(dataset, range(backend.rank, len(dataset), backend.world_size))
    correct = total = 0
    model.eval()
    with torch.no_grad():
        for x, y in DataLoader(shard, batch_size=256):
            pred = model(x.to(backend.device)).argmax(dim=1).cpu()
            correct += int((pred == y).sum())
            total += len(y)
    model.train()
    counts = backend.allreduce(torch.tensor([correct, total], dtype=torch.int64), op="sum")
    return counts[0].item() / counts[1].item()


def main(argv=None) -> dict:
    args = parse_args(argv)
    with paraflow.init(args.backend) as backend:
        torch.manual_seed(args.seed)
        train_set, test_set = load_dataset(args.data, seed=args.seed)
        sampler = backend.distributed_sampler(train_set, shuffle=True, seed=args.seed)
        loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
        model = backend.wrap_model(build_model(args.model))
        optimizer = backend.wrap_optimizer(
            torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9), model)

        step, step_times, start = 0, [], time.perf_counter()
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            loss_sum = torch.zeros((), dtype=torch.float64)
            batches = 0
            for x, y in loader:
                t0 = time.perf_counter()
                x, y = x.to(backend.device), y.to(backend.device)
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                if backend.device.type == "cuda":
                    torch.cuda.synchronize()
                step_times.append(time.perf_counter() - t0)
                loss_sum += loss.detach().cpu().double()
                batches += 1
                step += 1
                if args.steps and step >= args.steps:
                    break
            epoch_loss = backend.allreduce(loss_sum / max(batches, 1), op="mean").item()
            accuracy = evaluate(backend, model, test_set)
            if backend.is_main:
                print(f"epoch {epoch + 1}/{args.epochs}  loss {epoch_loss:.4f}  "
                      f"held-out accuracy {accuracy:.2%}  {time.perf_counter() - start:.1f}s", flush=True)
            if args.steps and step >= args.steps:
                break
        elapsed = time.perf_counter() - start

        # A step takes as long as its slowest rank.
        per_rank = backend.allgather(torch.tensor(step_times, dtype=torch.float64))
        slowest = torch.stack(per_rank).max(dim=0).values.tolist() if step_times else []
        result = {
            "backend": backend.name, "launcher": backend.launcher, "world_size": backend.world_size,
            "device": str(backend.device), "model": args.model, "data": args.data,
            "parameters": count_parameters(backend.unwrap(model)),
            "batch_size": args.batch_size, "global_batch_size": args.batch_size * backend.world_size,
            "steps": step, "epochs_run": epoch + 1, "final_loss": epoch_loss, "accuracy": accuracy,
            "elapsed_s": elapsed, "step_times_s": slowest,
        }
        if backend.is_main and args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(result, f, indent=2)
        return result


if __name__ == "__main__":
    main()
