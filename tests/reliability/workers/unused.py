"""Train a model with a layer that never takes part in the loss.

Usage: <launcher> python tests/reliability/workers/unused.py BACKEND [OPTION=VALUE ...]
Options go to paraflow.init (find_unused_parameters=1 is passed as True). Every rank prints
``EVENT {json}``: "ok" with a checksum of its parameters after 3 steps, or the error's type
and message, with the seconds since the first step began.
"""

import sys
import time

import torch
import torch.nn.functional as F
from report import emit
from torch import nn

import paraflow


class PartlyUsed(nn.Module):
    """A linear classifier plus a layer `spare` that forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, 4)
        self.spare = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def main(name: str, options: list) -> None:
    kwargs = {k: (True if v == "1" else v) for k, v in (o.split("=", 1) for o in options)}
    with paraflow.init(name, **kwargs) as backend:
        torch.manual_seed(0)
        model = backend.wrap_model(PartlyUsed())
        optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        start = time.perf_counter()
        try:
            for step in range(3):
                torch.manual_seed(100 + backend.rank * 10 + step)
                x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
            checksum = sum(float(p.detach().double().sum()) for p in backend.unwrap(model).parameters())
            fields = {"outcome": "ok", "checksum": checksum}
        except Exception as exc:  # noqa: BLE001 - reported to the test
            fields = {"outcome": "error", "type": type(exc).__name__, "message": str(exc)}
        emit({"rank": backend.rank, **fields, "seconds": time.perf_counter() - start})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
