"""Which launches a benchmark run makes: backends x launchers x process counts (x eager, compiled),
repeated, plus extras.

One launch (a cell) runs one backend under one launcher with one process count, and times
every model in turn (then, with two or more processes, the collective sweep). Every training
cell is launched `repeat` times, round after round (round r launches every cell once), so a
slow minute of the machine touches every cell alike rather than all launches of one. Before
the rounds, an A/A pair launches the first cell twice on the first model: how far two launches
of the same thing disagree is this machine's noise floor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Optional

from ...core.placement import cores
from ...core.registry import spec
from ...errors import ConfigurationError, UnknownBackendError
from .. import backends as bench_backends
from .config import BenchConfig

__all__ = ["Cell", "Matrix", "build_matrix", "BASELINE"]

#: The backend every other is compared with: one process, no wrapper.
BASELINE = "single"


@dataclass(frozen=True)
class Cell:
    """One launch of `kind` "train": a backend's models, then maybe the collective sweep."""

    kind: str
    backend: str
    launcher: str
    nproc: int
    threads: int
    models: tuple = ()
    sweep: bool = False
    tag: str = ""  # tells apart two cells that would otherwise share an id ("aa": the A/A pair)
    repeat: int = 0  # which launch of the same cell (1, 2, ...); 0 for cells launched once
    compiled: bool = False  # the models go through wrap_model(model, compile=True)

    @property
    def group(self) -> str:
        """The cell's name without its repeat number: launches of one group are pooled."""
        suffix = ("-compiled" if self.compiled else "") + (f"-{self.tag}" if self.tag else "")
        return f"{self.backend}-{self.launcher}-{self.nproc}{suffix}"

    @property
    def id(self) -> str:
        """A short unique name, also the folder of its raw per-rank JSON."""
        return self.group + (f"-r{self.repeat}" if self.repeat else "")

    @property
    def label(self) -> str:
        """What the cell runs, for the progress line."""
        procs = f"{self.nproc} process{'es' * (self.nproc > 1)}"
        what = ", ".join(m.label for m in self.models) + (" + collective sweep" if self.sweep else "")
        launch = (" · compiled" if self.compiled else "") + (f" · launch {self.repeat}" if self.repeat else "")
        aa = "A/A check: " if self.tag == "aa" else ""
        return f"{aa}{self.backend} · {self.launcher} · {procs} · {what}{launch}"


@dataclass
class Matrix:
    """The cells to launch, and the backends left out with the reason why."""

    cells: list = field(default_factory=list)
    skipped: dict = field(default_factory=dict)


def _backend_class(name: str) -> type:
    """The class registered as `name` (its traits decide the cells)."""
    return spec(name).load()


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
        names = list(dict.fromkeys([BASELINE, *config.backends]))  # the baseline is always there
    else:
        names = []
        for name, reason in available.items():
            registration = spec(name)
            skip = reason is None and bench_backends.skip_reason(name, cuda_devices)
            if registration.alias_of:
                matrix.skipped[name] = f"same as {registration.alias_of}"
            elif skip:
                matrix.skipped[name] = skip
            elif reason is None:
                names.append(name)
            else:
                matrix.skipped[name] = reason
        if BASELINE not in names:
            names.insert(0, BASELINE)
    for name in list(names):
        if available.get(name) is not None:
            matrix.skipped[name] = available[name]
            names.remove(name)
    if BASELINE not in names:
        raise ConfigurationError(f"the {BASELINE} baseline cannot run here: {matrix.skipped.get(BASELINE)}")

    models = tuple(config.models)
    # torch threads per process, the same at every process count (a rank of N processes computes as
    # the one-process baseline does): by default the cores shared by the largest process count
    threads = config.threads or max(1, total_cores // max(config.nprocs))
    train_cells: list[Cell] = []
    sweeps: set = set()
    for name in names:
        cls, presets = _backend_class(name), spec(name).presets
        launchers = programs = cls.launch_programs()
        if config.launchers and name != BASELINE:
            launchers = tuple(launcher for launcher in launchers if launcher in config.launchers)
            if not launchers:
                matrix.skipped[name] = f"none of its launchers ({', '.join(programs)}) was asked for"
                continue
        counts = config.nprocs if cls.MULTI_PROCESS else [1]
        limit = cls.process_limit(cuda_devices, **presets)
        if limit is not None and cls.MULTI_PROCESS:
            too_many = [n for n in counts if n > limit]
            if too_many:
                matrix.skipped[f"{name} x {too_many}"] = f"one process per GPU and {cuda_devices} GPU(s) are visible"
            counts = [n for n in counts if n <= limit]
        for launcher in launchers:
            for n in counts:
                swept = (bench_backends.collectives_key(name), launcher, n)  # fsdp's collectives are ddp's
                sweep = config.allreduce and n >= 2 and swept not in sweeps
                sweeps.add(swept)
                for compiled in [mode == "yes" for mode in config.compile]:
                    first = compiled == (config.compile[0] == "yes")  # the sweep rides on one
                    train_cells.append(
                        Cell("train", name, launcher, n, threads, models, sweep=sweep and first, compiled=compiled)
                    )

    if config.aa_check and train_cells:
        first = train_cells[0]
        for r in (1, 2):
            matrix.cells.append(replace(first, models=models[:1], sweep=False, tag="aa", repeat=r))
    for r in range(1, config.repeat + 1):
        matrix.cells.extend(replace(cell, repeat=r) for cell in train_cells)
    return matrix
