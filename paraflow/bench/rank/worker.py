"""What each rank of a benchmark launch runs; writes its raw numbers to OUT/rank<R>.json.

    <launcher> python -m paraflow.bench.rank.worker --out DIR --task '{"backend": "ddp-gloo", ...}'

The task is the cell's part of the run's BenchConfig (driver/runner.py's worker_args), as JSON.
The file is rewritten after every task, so a launch that dies part-way keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

__all__ = ["main", "leave"]


class RankFile:
    """This rank's JSON, rewritten atomically after each task."""

    def __init__(self, directory: Path, rank: int, meta: dict) -> None:
        self.path = directory / f"rank{rank}.json"
        self.data = {**meta, "tasks": {}}
        self.write()

    def add(self, task: str, result: dict) -> None:
        self.data["tasks"][task] = result
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="folder for rank<R>.json")
    p.add_argument("--task", required=True, type=json.loads, help="what to run, as JSON (see the module doc)")
    return p.parse_args(argv)


def _meta(backend) -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "torch_threads": torch.get_num_threads(),
        "rank": backend.rank,
        "world_size": backend.world_size,
        "local_rank": backend.local_rank,
        "local_world_size": backend.local_world_size,
        "backend": backend.name,
        "launcher": backend.launcher,
        "transport": backend.transport or "none",
        "device": str(backend.device),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    task = SimpleNamespace(**args.task)

    import paraflow

    from ..model_spec import ModelSpec
    from ..report.launches import TASK_PREFIX
    from .train_loop import run_training

    with paraflow.init(task.backend) as backend:
        rank_file = RankFile(args.out, backend.rank, _meta(backend))
        for text in task.models:
            spec = ModelSpec.parse(text)
            for scaling in task.scaling:
                if scaling == "strong" and backend.world_size == 1:
                    continue  # one process: the same run as weak scaling
                result = run_training(backend, spec, task, scaling)
                rank_file.add(f"{TASK_PREFIX[scaling]}/{spec}", result)
        if task.sweep_sizes:
            from ..backends import raw_loop
            from .sweep import run_sweep

            sweep = run_sweep(backend, raw_loop(task.backend), task.sweep_sizes, task.collectives)
            rank_file.add("sweep", sweep)
    return 0


def leave(code: int) -> None:
    """Exit with `code` once everything is written and the backend is shut down, skipping the
    interpreter's teardown of torch's modules (0.65 s per launch here, as multiprocessing's
    children exit), except under MPI, which must see MPI_Finalize run at interpreter exit."""
    from ...environment.launchers import detect_environment

    if detect_environment().is_mpi:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
