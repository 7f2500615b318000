"""What each rank of a benchmark launch runs; writes its raw numbers to OUT/rank<R>.json.

    <launcher> python -m paraflow.bench.rank.worker --out DIR --backend NAME --model mlp --model cnn \
        [--sweep-sizes 4096,65536 --collectives allreduce,allgather] [--scaling weak,strong] \
        ...

The file is rewritten after every task, so a launch that dies part-way keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

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


def _sizes(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="folder for rank<R>.json")
    p.add_argument("--backend", required=True, help="paraflow backend to train under")
    p.add_argument("--model", action="append", default=[], help="model spec to train (repeatable)")
    p.add_argument("--sweep-sizes", type=_sizes, default=[], help="comma-separated bytes for the collective sweep")
    p.add_argument("--collectives", default="allreduce", help="comma-separated collectives for the sweep")
    p.add_argument("--scaling", default="weak", help="weak, strong or weak,strong")
    p.add_argument("--max-warmup", type=float, default=2.0, help="seconds of warm-up steps, at most")
    p.add_argument("--data", default="synthetic")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--input-shape", type=_sizes, default=None, help="one sample's shape for a factory's bare module")
    p.add_argument("--classes", type=int, default=10, help="classes of that module's synthetic batch")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30, help="timed steps, at least")
    p.add_argument("--min-window", type=float, default=0.0, help="seconds the timed window lasts, at least")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="wrap_model(model, compile=True)")
    return p.parse_args(argv)


def _meta(backend=None) -> dict:
    meta = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "torch_threads": torch.get_num_threads(),
    }
    if backend is not None:
        meta.update(
            rank=backend.rank,
            world_size=backend.world_size,
            local_rank=backend.local_rank,
            local_world_size=backend.local_world_size,
            backend=backend.name,
            launcher=backend.launcher,
            transport=backend.transport or "none",
            device=str(backend.device),
        )
    else:
        meta.update(rank=0, world_size=1, local_rank=0, local_world_size=1, device="cpu")
    return meta


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    import paraflow

    from ..model_spec import ModelSpec
    from ..report.launches import TASK_PREFIX
    from .train_loop import run_training

    with paraflow.init(args.backend) as backend:
        rank_file = RankFile(args.out, backend.rank, _meta(backend))
        for text in args.model:
            spec = ModelSpec.parse(text)
            for scaling in args.scaling.split(","):
                if scaling == "strong" and backend.world_size == 1:
                    continue  # one process: the same run as weak scaling
                result = run_training(backend, spec, args, scaling)
                rank_file.add(f"{TASK_PREFIX[scaling]}/{spec}", result)
        if args.sweep_sizes:
            from ..backends import raw_loop
            from .sweep import run_sweep

            raw = raw_loop(args.backend)
            sweep = run_sweep(backend, raw, args.sweep_sizes, args.collectives.split(","))
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
