"""Gradient averaging and per-rank model-state bytes, under any multi-process backend.

Usage: <launcher> python checks.py BACKEND OUT_DIR
Each rank backpropagates a loss on its own rows, so ranks' gradients differ. The synchronised
gradient is compared with the mean and the sum of every rank's local gradient (computed on an
unwrapped copy of the same model and gathered). Then two AdamW steps, and the bytes of
parameters, gradients and optimizer state this rank holds (the benchmark's own count). Every
rank writes OUT_DIR/rank<R>.json.
"""

import copy
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import paraflow
from paraflow.bench.rank.train_loop import model_state_bytes
from paraflow.examples.models import build_model


def full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def main(name: str, out_dir: str) -> None:
    torch.set_default_dtype(torch.float64)
    with paraflow.init(name) as backend:
        torch.manual_seed(0)
        module = build_model("mlp", width=16)  # every dim 0 even: shards of exactly half
        reference = copy.deepcopy(module)
        model = backend.wrap_model(module)
        optimizer = backend.wrap_optimizer(torch.optim.AdamW(model.parameters(), lr=0.01), model)
        g = torch.Generator().manual_seed(100 + backend.rank)  # different rows on every rank
        x, y = torch.randn(6, 1, 8, 8, generator=g), torch.randint(0, 10, (6,), generator=g)

        F.cross_entropy(model(x), y).backward()
        F.cross_entropy(reference(x), y).backward()
        names = [n for n, _ in reference.named_parameters()]
        synced = {n: full(p.grad) for n, p in backend.unwrap(model).named_parameters()}
        local = [p.grad for p in reference.parameters()]
        every = [backend.allgather(t) for t in local]  # every rank's local gradient, per parameter
        mean = {n: torch.stack(ts).mean(0) for n, ts in zip(names, every)}
        total = {n: torch.stack(ts).sum(0) for n, ts in zip(names, every)}
        optimizer.step()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        result = {
            "error_vs_mean": max((synced[n] - mean[n]).abs().max().item() for n in names),
            "error_vs_sum": max((synced[n] - total[n]).abs().max().item() for n in names),
            "ranks_differ": max((every_rank[0] - every_rank[-1]).abs().max().item() for every_rank in every),
            "model_state_bytes": model_state_bytes(model, optimizer),
            "full_parameter_bytes": sum(p.numel() * p.element_size() for p in reference.parameters()),
        }
        Path(out_dir, f"rank{backend.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
