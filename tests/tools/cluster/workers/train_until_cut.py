"""Ranks train step after step until their link is cut; each says when it got going and how it ended.

Usage: <launcher> python train_until_cut.py BACKEND OUTDIR [MAX_STEPS]
After step 5 rank r creates OUTDIR/rank<r>.started, so the test knows training is under way;
any error leaving the loop is written to OUTDIR/rank<r>.error (type and message) and re-raised,
so the launcher sees the rank fail.
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record

import paraflow
from paraflow.examples.models import build_model


@record
def main(name: str, out: str, max_steps: int = 1_000_000) -> None:
    rank = -1
    try:
        with paraflow.init(name) as backend:
            rank = backend.rank
            torch.manual_seed(0)
            model = backend.wrap_model(build_model("mlp", width=16))
            optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
            for step in range(1, max_steps + 1):
                x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                if step == 5:
                    Path(out, f"rank{rank}.started").touch()
    except BaseException as exc:
        Path(out, f"rank{rank}.error").write_text(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
        raise


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:4]))
