"""Horovod backend behaviour on real ranks; each rank writes what it saw to OUT/rank<R>.json.

Usage: <launcher> python tests/workers/horovod_checks.py OUT [OPTIONS_JSON]
OPTIONS_JSON goes to paraflow.init("horovod", **options). Checked here:
- which controller the launcher gave;
- allreduce / allgather / broadcast of tensors whose shapes differ across ranks raise on every
  rank, quickly, and the job still works afterwards;
- wrap_model gives every rank rank 0's parameters and buffers;
- wrap_optimizer gives every rank rank 0's optimizer state and hyperparameters, and leaves a
  fresh optimizer without state (no hidden step);
- the gradient rank r computes is 1 + r in every entry; what the optimizer hands to step().
"""

import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

import paraflow
from paraflow.errors import CollectiveError, ConfigurationError


def flat(module_or_tensors) -> torch.Tensor:
    tensors = module_or_tensors.state_dict().values() if isinstance(module_or_tensors, nn.Module) else module_or_tensors
    return torch.cat([t.detach().double().reshape(-1) for t in tensors])


def same_everywhere(backend, tensor: torch.Tensor) -> bool:
    return all(torch.equal(t, tensor) for t in backend.allgather(tensor))


def mismatches(backend) -> dict:
    r, seen = backend.rank, {}
    backend.allreduce(torch.ones(3), op="sum")  # the same name again below, now with other shapes
    calls = {
        "allreduce": lambda: backend.allreduce(torch.ones(2 + r), op="sum"),
        "allgather": lambda: backend.allgather(torch.ones(2 + r)),
        "broadcast": lambda: backend.broadcast(torch.ones(2 + r), src=0),
    }
    for name, call in calls.items():
        start = time.monotonic()
        try:
            call()
            seen[name] = {"raised": None}
        except CollectiveError as exc:
            seen[name] = {"raised": type(exc).__name__, "message": str(exc)}
        seen[name]["seconds"] = time.monotonic() - start
    seen["after"] = backend.allreduce(torch.ones(2), op="sum").tolist()
    return seen


def broadcasts(backend) -> dict:
    r = backend.rank
    torch.manual_seed(100 + r)  # every rank starts from its own random model
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    model[1].running_mean.fill_(float(r))
    model[1].num_batches_tracked.fill_(7 + r)
    before = flat(model)
    model = backend.wrap_model(model)
    result = {
        "model_same": same_everywhere(backend, flat(model)),
        "rank0_model_kept": torch.equal(flat(model), before) if r == 0 else None,
        "buffers_from_rank0": model[1].running_mean.tolist() == [0.0] * 4 and int(model[1].num_batches_tracked) == 7,
    }

    # An optimizer with state on rank 0 only and a different learning rate on every rank.
    sgd = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9, weight_decay=0.01)
    if r == 0:
        for p in model.parameters():
            sgd.state[p]["momentum_buffer"] = torch.full_like(p, 0.5)
    sgd = backend.wrap_optimizer(sgd, model)
    buffers = [sgd.state[p]["momentum_buffer"] for p in model.parameters()]
    result.update(
        lr=sgd.param_groups[0]["lr"],
        momentum_same=same_everywhere(backend, flat(buffers)),
        momentum_from_rank0=all(torch.equal(b, torch.full_like(b, 0.5)) for b in buffers),
        model_same_after_optimizer=same_everywhere(backend, flat(model)),
    )

    # A fresh optimizer: nothing to broadcast but hyperparameters; no zero-gradient step taken.
    adam_model = backend.wrap_model(nn.Linear(3, 2))
    weights = flat(adam_model)
    adam = backend.wrap_optimizer(torch.optim.Adam(adam_model.parameters(), lr=0.01, weight_decay=0.1), adam_model)
    result.update(adam_state_empty=len(adam.state) == 0, adam_model_unchanged=torch.equal(flat(adam_model), weights))
    try:
        backend.wrap_optimizer(torch.optim.SGD(adam_model.parameters(), lr=0.1))
        result["missing_model_error"] = None
    except ConfigurationError as exc:
        result["missing_model_error"] = str(exc)
    return result


def gradient(backend) -> list:
    """Rank r's gradient is 1 + r everywhere; return what step() would apply."""
    model = backend.wrap_model(nn.Linear(4, 1, bias=False))
    optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.0), model)
    optimizer.zero_grad(set_to_none=True)
    (model(torch.full((1, 4), 1.0 + backend.rank)).sum()).backward()
    optimizer.synchronize()
    grad = model.weight.grad.clone()
    with optimizer.skip_synchronize():
        optimizer.step()
    return grad.reshape(-1).tolist()


def main(out: Path, options: dict) -> None:
    with paraflow.init("horovod", **options) as backend:
        result = {
            "rank": backend.rank,
            "world_size": backend.world_size,
            "launcher": backend.launcher,
            "controller": backend.controller,
            "transport": backend.transport,
            "mismatch": mismatches(backend),
            "broadcast": broadcasts(backend),
            "gradient": gradient(backend),
        }
    (out / f"rank{result['rank']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
