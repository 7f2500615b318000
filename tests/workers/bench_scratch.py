"""A benchmark launch under mpirun that is killed at its timeout, for the runner's scratch directories.

Usage: mpirun -np N python tests/workers/bench_scratch.py OUT
Every rank starts MPI (Open MPI maps its shared-memory segments), then writes OUT/scratch<R>.json
with its TMPDIR, its shared-memory backing directory and what that directory holds, then hangs.
"""

import json
import os
import sys
import time
from pathlib import Path

from mpi4py import MPI


def main(out: Path) -> None:
    comm = MPI.COMM_WORLD
    comm.barrier()
    shm = os.environ.get("OMPI_MCA_btl_vader_backing_directory", "")
    record = {"tmpdir": os.environ.get("TMPDIR", ""), "shm": shm, "files": sorted(os.listdir(shm)) if shm else []}
    (out / f"scratch{comm.Get_rank()}.json").write_text(json.dumps(record))
    comm.barrier()
    time.sleep(3600)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
