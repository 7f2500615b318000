"""Each rank says who it is, where rank 0 is, and proves it talks to the other host over eth0.

Usage: <launcher> python whoami.py BACKEND OUTDIR
Rank r writes OUTDIR/rank<r>.json: its host name, what paraflow detected (launcher, ranks, sizes),
rank 0's address as paraflow resolves it, the sum of an allreduce of (rank + 1) over 1 MB, and
the bytes its host's eth0 sent and received during that allreduce, and the sums of a few repeats.
"""

import json
import socket
import sys
from pathlib import Path

import torch

import paraflow
from paraflow.environment.launchers import detect_environment
from paraflow.environment.rendezvous import resolve_master


def link_bytes() -> int:
    stats = Path("/sys/class/net/eth0/statistics")
    return int((stats / "tx_bytes").read_text()) + int((stats / "rx_bytes").read_text())


def main(name: str, out: str) -> None:
    env = detect_environment()
    master = resolve_master(env) if env.launcher != "horovodrun" or name != "horovod" else None
    with paraflow.init(name) as backend:
        before = link_bytes()
        total = backend.allreduce(torch.full((250_000,), float(backend.rank + 1)), op="sum")
        crossed = link_bytes() - before
        repeated = [backend.allreduce(torch.ones(250_000), op="sum") for _ in range(5)]
        report = {
            "host": socket.gethostname(),
            "launcher": env.launcher,
            "rank": env.rank,
            "world_size": env.world_size,
            "local_rank": env.local_rank,
            "local_world_size": env.local_world_size,
            "backend_rank": backend.rank,
            "master": master,
            "sum": total[0].item(),
            "uniform": bool((total == total[0]).all()),
            "link_bytes": crossed,
            "repeated_sums": sorted({float(x.min()) for x in repeated} | {float(x.max()) for x in repeated}),
        }
    Path(out, f"rank{env.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
