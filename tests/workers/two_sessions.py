"""Two `with paraflow.init(...)` blocks one after the other in one process; print each sum.

Usage: <launcher> python tests/workers/two_sessions.py BACKEND OUT
Rank r contributes r + 1 in session 1 and 10 * (r + 1) in session 2; OUT/rank<R>.json holds its sums.
"""

import json
import sys
from pathlib import Path

import torch

import paraflow


def main(name: str, out: Path) -> None:
    sums = []
    for scale in (1.0, 10.0):
        with paraflow.init(name) as backend:
            sums.append(backend.allreduce(torch.tensor([scale * (backend.rank + 1)]), op="sum").item())
            rank = backend.rank
    (out / f"rank{rank}.json").write_text(json.dumps(sums))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
