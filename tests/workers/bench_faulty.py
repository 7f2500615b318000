"""A benchmark cell gone wrong, for the runner's failure handling.

Usage: <launcher> python tests/workers/bench_faulty.py MODE OUT
  hang:     every rank records its pid in OUT/pids/, rank 0 writes a partial result, all sleep.
  one-rank: rank 0 writes its result, the others write nothing; every rank exits 0.
"""

import json
import os
import sys
import time
from pathlib import Path


def rank() -> int:
    for key in ("RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def main(mode: str, out: Path) -> None:
    r = rank()
    if mode == "hang":
        (out / "pids").mkdir(parents=True, exist_ok=True)
        (out / "pids" / str(os.getpid())).write_text(str(r))
        if r == 0:
            (out / "rank0.json").write_text(json.dumps({"rank": 0, "tasks": {}}))
        time.sleep(3600)
    elif mode == "one-rank":
        if r == 0:
            (out / "rank0.json").write_text(json.dumps({"rank": 0, "tasks": {}}))
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
