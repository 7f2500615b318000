"""24 public collectives on plain tensors, then shutdown: the end of a job that did all its work.

Usage: <launcher> python tests/workers/clean_exit.py BACKEND [slow-store]
Six rounds of allreduce_, allreduce, broadcast and allgather on tensors made for the call, then
``backend.shutdown()``; every rank prints ``rank R made N collectives`` and the process exits.
With ``slow-store`` the stall watch's store answers late: its thread's first wake (0.5 s after
init) sits in a store operation (torch's C++, the GIL released) for 3 s, and shutdown comes 1.5 s
after init, while the thread is still inside it.
"""

import datetime
import sys
import time

import torch

import paraflow
from paraflow.reliability import stall

ROUNDS = 6


def late_store_answer(self, store) -> None:
    """A store operation that comes back late: a real wait on a key nobody sets."""
    try:
        store.wait(["never-set"], datetime.timedelta(seconds=3))
    except Exception:  # noqa: BLE001 - the store's timeout, as expected
        pass


def main(name: str, slow_store: bool) -> None:
    options = {}
    if slow_store:
        stall.StallWatch._tick = late_store_answer
        options["stall_threshold"] = 2.0  # the watch wakes every 0.5 s
    backend = paraflow.init(name, **options)
    before = backend.collective_count  # horovod's stall watch sends its store's address in init
    for i in range(ROUNDS):
        backend.allreduce_(torch.full((4,), float(backend.rank + i)))
        backend.allreduce(torch.ones(1000 + i), op="max")
        backend.broadcast(torch.arange(12.0).reshape(3, 4), src=1)
        backend.allgather(torch.ones(5))
    if slow_store:
        time.sleep(1.5)
    print(f"rank {backend.rank} made {backend.collective_count - before} collectives", flush=True)
    backend.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] == ["slow-store"])
