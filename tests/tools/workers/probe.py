"""A rank that does one thing on cue, without importing torch (fast under any launcher).

probe.py exit CODE           every rank exits with CODE
probe.py kill RANK DIR       RANK SIGKILLs itself once every rank has started; the others sleep
probe.py sleep DIR           every rank says it started, then sleeps
probe.py identity DIR        every rank writes its launcher variables to DIR/rank<R>.json
Extra arguments after these are ignored.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path


def rank() -> int:
    for key in ("RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def world() -> int:
    for key in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "HOROVOD_SIZE", "SLURM_NTASKS"):
        if key in os.environ:
            return int(os.environ[key])
    return 1


def started(directory: Path) -> None:
    (directory / f"started{rank()}").write_text(str(os.getpid()))


mode, args = sys.argv[1], sys.argv[2:]
if mode == "exit":
    sys.exit(int(args[0]))
if mode == "kill":
    directory = Path(args[1])
    started(directory)
    if rank() == int(args[0]):
        while len(list(directory.glob("started*"))) < world():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(300)
if mode == "sleep":
    started(Path(args[0]))
    time.sleep(300)
if mode == "identity":
    keys = ("RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_RANK", "MASTER_ADDR", "PARAFLOW_BACKEND")
    (Path(args[0]) / f"rank{rank()}.json").write_text(json.dumps({k: os.environ.get(k) for k in keys}))
