"""One rank leaves a collective call out, inside a paraflow call that is not a collective itself.

Usage: <launcher> python tests/reliability/workers/messages.py BACKEND CASE DIR
CASE, where rank 1 sleeps past the timeout instead of joining:
    save        backend.save(DIR/ckpt.pt, ...)
    load        backend.load(DIR/ckpt.pt, ...) (after a save every rank joined)
    wrap_model  backend.wrap_model(model)
Before the case every rank calls ``wrap_model`` on a model it already wrapped and reports what it
raised. Every rank prints ``EVENT {json}``: that report, and the error that leaves the case.
"""

import os
import sys
import time

import torch
from report import emit

import paraflow
from paraflow.examples.models import build_model


def main(name: str, case: str, directory: str) -> None:
    path = os.path.join(directory, "ckpt.pt")
    with paraflow.init(name) as backend:
        rank = backend.rank
        torch.manual_seed(0)
        if case != "wrap_model":
            model = backend.wrap_model(build_model("mlp", width=16))
            try:
                backend.wrap_model(model)
                emit({"rank": rank, "case": "twice", "type": "none"})
            except Exception as exc:  # noqa: BLE001 - reported to the test
                emit({"rank": rank, "case": "twice", "type": type(exc).__name__, "message": str(exc)})
        state = {"model": model} if case != "wrap_model" else {}
        if case == "load":
            backend.save(path, state)
        skip = rank == 1
        try:
            if skip:
                emit({"rank": rank, "case": case, "skipping": True, "time": time.time()})
                time.sleep(backend.timeout + 60)
            elif case == "save":
                backend.save(path, state)
            elif case == "load":
                backend.load(path, state)
            else:
                backend.wrap_model(build_model("mlp", width=16))
        except Exception as exc:
            emit({"rank": rank, "case": case, "type": type(exc).__name__, "message": str(exc), "time": time.time()})
            raise


if __name__ == "__main__":
    main(*sys.argv[1:4])
