"""One script for every backend: both libraries' tuning options, wrap_optimizer without the model,
and paraflow.current() from code that is not handed the backend.

Usage: <launcher> python tests/workers/portable.py BACKEND OUTDIR
Trains a float64 linear model for STEPS steps on fixed data, each rank on its slice of every
global batch (the whole batch in one process), and writes OUTDIR/rank<r>.json: the final
parameters, what paraflow.current() / rank() / world_size() said inside the loop, and the
options the backend ignored.
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import paraflow

STEPS, GLOBAL_BATCH = 5, 8
# What a script tuned for both libraries passes: horovod's and DDP's own options side by side.
TUNING = {
    "reduce_op": "average",
    "fusion_threshold_mb": 16,
    "bucket_cap_mb": 1,
    "gradient_as_bucket_view": True,
    "broadcast_buffers": False,
}


def shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's rows of a global batch, found without being handed the backend."""
    backend = paraflow.current()
    per_rank = len(tensor) // backend.world_size
    return tensor[backend.rank * per_rank : (backend.rank + 1) * per_rank]


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: fsdp's parameters are shards (DTensor), gathered here."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def who_am_i() -> dict:
    return {"current_id": id(paraflow.current()), "rank": paraflow.rank(), "world_size": paraflow.world_size()}


def main(name: str, outdir: Path) -> None:
    with paraflow.init(name, **TUNING) as backend:
        torch.manual_seed(0)
        model = backend.wrap_model(torch.nn.Linear(6, 3).double())
        optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        data = torch.Generator().manual_seed(1)
        seen = []
        for _ in range(STEPS):
            x = torch.randn(GLOBAL_BATCH, 6, generator=data, dtype=torch.float64)
            y = torch.randint(0, 3, (GLOBAL_BATCH,), generator=data)
            optimizer.zero_grad()
            F.cross_entropy(model(shard(x)), shard(y)).backward()
            optimizer.step()
            seen.append(who_am_i())
        result = {
            "rank": backend.rank,
            "world_size": backend.world_size,
            "backend_id": id(backend),
            "seen": seen,
            "ignored": sorted(backend.ignored_options),
            "params": [whole(p).detach().flatten().tolist() for p in backend.unwrap(model).parameters()],
        }
        (outdir / f"rank{backend.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
