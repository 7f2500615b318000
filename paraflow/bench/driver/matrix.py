"""Which launches a benchmark run makes: backends x launchers x process counts, plus extras.

One launch (a cell) runs one backend under one launcher with one process count, and times
every model in turn (then, with two or more processes, the allreduce sweep). Separate cells
measure memory-copy bandwidth and the abstraction overhead against hand-written loops.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from ...core.placement import cores
from ...errors import ConfigurationError, UnknownBackendError
from .config import BenchConfig

__all__ = ["Cell", "Matrix", "build_matrix", "BACKEND_LAUNCHERS", "OVERHEAD_LAUNCHER"]

#: The launchers each backend is started with; any other backend gets torchrun.
BACKEND_LAUNCHERS = {"single": ("python",), "dp": ("python",), "horovod": ("mpirun", "horovodrun")}
#: Backends with a hand-written raw loop for the abstraction overhead, and the launcher it uses.
OVERHEAD_LAUNCHER = {"ddp-gloo": "torchrun", "ddp-nccl": "torchrun", "horovod": "mpirun"}
#: One-process backends: they run at one process whatever the process counts say.
ONE_PROCESS = ("single", "dp")
#: Aliases left out of the default matrix because another name runs the same thing.
ALIASES = {"ddp": "ddp-gloo or ddp-nccl"}


@dataclass(frozen=True)
class Cell:
    """One launch: `kind` is "train" (a backend's models, maybe the allreduce sweep), "memcpy"
    (this machine's memory-copy bandwidth) or "overhead" (paraflow against a raw loop)."""

    kind: str
    backend: Optional[str]
    launcher: str
    nproc: int
    threads: int
    models: tuple = ()
    allreduce: bool = False
    tag: str = ""  # tells apart two cells that would otherwise share an id

    @property
    def id(self) -> str:
        """A short unique name, also the folder of its raw per-rank JSON."""
        suffix = f"-{self.tag}" if self.tag else ""
        if self.kind == "memcpy":
            return "memcpy" + suffix
        prefix = "overhead-" if self.kind == "overhead" else ""
        return f"{prefix}{self.backend}-{self.launcher}-{self.nproc}{suffix}"

    @property
    def label(self) -> str:
        """What the cell runs, for the progress line."""
        if self.kind == "memcpy":
            return f"memory-copy bandwidth ({self.threads} thread{'s' * (self.threads > 1)})"
        procs = f"{self.nproc} process{'es' * (self.nproc > 1)}"
        if self.kind == "overhead":
            return (
                f"abstraction overhead: {self.backend} via paraflow vs raw, {self.launcher}, {procs}, "
                f"{self.models[0].label}"
            )
        what = ", ".join(m.label for m in self.models) + (" + allreduce" if self.allreduce else "")
        return f"{self.backend} · {self.launcher} · {procs} · {what}"


@dataclass
class Matrix:
    """The cells to launch, and the backends left out with the reason why."""

    cells: list = field(default_factory=list)
    skipped: dict = field(default_factory=dict)


def _threads(nproc: int, total: int) -> int:
    return max(1, total // nproc)


def build_matrix(
    config: BenchConfig,
    available: Optional[Mapping[str, Optional[str]]] = None,
    cuda_devices: Optional[int] = None,
    total_cores: Optional[int] = None,
) -> Matrix:
    """The cells for `config` on this machine.

    Args:
        config: what to run.
        available: backend name -> None if it can run here, else why not
            (default: paraflow.available_backends()).
        cuda_devices: visible GPUs (default: torch.cuda.device_count()).
        total_cores: CPU cores to share among a cell's processes (default: this machine's).
    """
    if available is None:
        from ...core.registry import available_backends

        available = available_backends()
    if cuda_devices is None:
        import torch

        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    total_cores = total_cores or cores()
    matrix = Matrix()

    if config.backends:
        unknown = [b for b in config.backends if b not in available]
        if unknown:
            raise UnknownBackendError(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(available)}.")
        names = list(dict.fromkeys(["single", *config.backends]))  # the baseline is always there
    else:
        names = []
        for name, reason in available.items():
            if name in ALIASES:
                matrix.skipped[name] = f"same as {ALIASES[name]}"
            elif name == "dp" and not cuda_devices:
                matrix.skipped[name] = (
                    "no GPU: DataParallel would be a pass-through of single (ask for it with --backends dp)"
                )
            elif reason is None:
                names.append(name)
            else:
                matrix.skipped[name] = reason
        if "single" not in names:
            names.insert(0, "single")
    for name in list(names):
        if available.get(name) is not None:
            matrix.skipped[name] = available[name]
            names.remove(name)
    if "single" not in names:
        raise ConfigurationError("the single baseline cannot run here: " + str(matrix.skipped.get("single")))

    models = tuple(config.models)
    multi_nprocs = [n for n in config.nprocs if n >= 2]
    train_cells: list[Cell] = []
    for name in names:
        launchers = BACKEND_LAUNCHERS.get(name, ("torchrun",))
        if config.launchers and name != "single":
            launchers = tuple(launcher for launcher in launchers if launcher in config.launchers)
            if not launchers:
                matrix.skipped[name] = (
                    f"none of its launchers ({', '.join(BACKEND_LAUNCHERS.get(name, ('torchrun',)))}) was asked for"
                )
                continue
        counts = [1] if name in ONE_PROCESS else config.nprocs
        if name == "ddp-nccl" and cuda_devices:
            too_many = [n for n in counts if n > cuda_devices]
            if too_many:
                matrix.skipped[f"ddp-nccl x {too_many}"] = f"one process per GPU and {cuda_devices} GPU(s) are visible"
            counts = [n for n in counts if n <= cuda_devices]
        for launcher in launchers:
            for n in counts:
                threads = total_cores if name == "dp" else _threads(n, total_cores)
                train_cells.append(
                    Cell("train", name, launcher, n, threads, models, allreduce=config.allreduce and n >= 2)
                )

    if config.allreduce and any(c.allreduce for c in train_cells):
        widest = max(multi_nprocs) if multi_nprocs else 1
        matrix.cells.append(Cell("memcpy", None, "python", 1, _threads(widest, total_cores)))
    matrix.cells.extend(train_cells)

    if config.overhead:
        n = max(config.nprocs)
        for name, launcher in OVERHEAD_LAUNCHER.items():
            if name in names and (not config.launchers or launcher in config.launchers):
                if name == "ddp-nccl":
                    n_here = min(n, cuda_devices) if cuda_devices else 0
                    if not n_here:
                        continue
                else:
                    n_here = n
                matrix.cells.append(
                    Cell("overhead", name, launcher, n_here, _threads(n_here, total_cores), (config.overhead_model,))
                )
    return matrix
