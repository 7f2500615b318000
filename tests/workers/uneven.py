"""Train with a different number of batches on each rank under backend.join.

Usage: <launcher> python tests/workers/uneven.py BACKEND OUTDIR SKEW [SKEW ...]
For each SKEW, rank r runs BASE + r * SKEW batches (rank 0 finishes first) inside
``backend.join(model, optimizer)``, then every rank writes OUTDIR/rank<r>.json with, per skew,
the batches it ran and its flattened parameters and momentum buffers after the join.
A missing or broken join makes the ranks disagree on collectives: an error or a hang (the
backend timeout is short, and the test launch has a hard timeout).
"""

import json
import os
import sys

import torch
import torch.nn.functional as F

import paraflow
from paraflow.examples.models import build_model

BASE, BATCH = 2, 4


def main(name: str, outdir: str, skews: list) -> None:
    result = {}
    with paraflow.init(name, timeout=60) as backend:
        for skew in skews:
            torch.manual_seed(0)
            model = backend.wrap_model(build_model("mlp", width=8))
            optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model)
            g = torch.Generator().manual_seed(100 + backend.rank)  # different data on every rank
            batches = BASE + backend.rank * skew
            with backend.join(model, optimizer):
                for _ in range(batches):
                    x, y = torch.randn(BATCH, 1, 8, 8, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
                    optimizer.zero_grad()
                    F.cross_entropy(model(x), y).backward()
                    optimizer.step()
            params = torch.cat([p.detach().flatten() for p in backend.unwrap(model).parameters()])
            momentum = torch.cat(
                [optimizer.state[p]["momentum_buffer"].flatten() for p in backend.unwrap(model).parameters()]
            )
            result[str(skew)] = {"batches": batches, "params": params.tolist(), "momentum": momentum.tolist()}
            # Outside the join every rank is back in step: an ordinary collective must work.
            assert backend.allreduce(torch.ones(1), op="sum").item() == backend.world_size
        with open(os.path.join(outdir, f"rank{backend.rank}.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3:]])
