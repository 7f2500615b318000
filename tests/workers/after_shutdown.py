"""Shut a backend down, then call every collective; print what each one raised.

Usage: <launcher> python tests/workers/after_shutdown.py BACKEND
Every rank prints ``EVENT {json}`` per call: the collective, the error's type, message and
whether it is a paraflow error (or "none" if the call returned).
"""

import json
import sys

import torch

import paraflow


def main(name: str) -> None:
    backend = paraflow.init(name)
    rank = backend.rank
    backend.allreduce(torch.ones(1), op="sum")  # it worked while initialised
    backend.shutdown()
    calls = {
        "allreduce": lambda: backend.allreduce(torch.ones(1), op="sum"),
        "broadcast": lambda: backend.broadcast(torch.ones(1), src=0),
        "allgather": lambda: backend.allgather(torch.ones(1)),
        "barrier": backend.barrier,
    }
    for collective, call in calls.items():
        try:
            call()
            outcome = {"type": "none"}
        except Exception as exc:  # noqa: BLE001 - reported to the test
            outcome = {
                "type": type(exc).__name__,
                "message": str(exc),
                "paraflow": isinstance(exc, paraflow.ParaflowError),
            }
        record = {"rank": rank, "collective": collective, **outcome}
        sys.stdout.write("EVENT " + json.dumps(record) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
