"""Start a backend and run one allreduce; report how starting went.

Usage: <launcher or hand-set variables> python tests/reliability/workers/startup.py BACKEND
Every rank prints ``EVENT {json}``: "ok", or the error's type and message, with the seconds
``paraflow.init`` took. An error is raised again after it is reported.
"""

import sys
import time

import torch
from report import emit

import paraflow


def main(name: str) -> None:
    start = time.perf_counter()
    try:
        with paraflow.init(name) as backend:
            backend.allreduce(torch.ones(1), op="sum")
            fields = {"rank": backend.rank, "outcome": "ok"}
    except Exception as exc:
        fields = {
            "outcome": "error",
            "type": type(exc).__name__,
            "message": str(exc),
            "paraflow": isinstance(exc, paraflow.ParaflowError),
        }
        raise
    finally:
        fields["seconds"] = time.perf_counter() - start
        emit(fields)


if __name__ == "__main__":
    main(sys.argv[1])
