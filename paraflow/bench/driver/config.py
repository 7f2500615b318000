"""What a benchmark run measures: backends, process counts, models, steps, message sizes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from ...errors import ConfigurationError
from ..model_spec import ModelSpec
from ..report.verdict import DEFAULT_MARGIN

__all__ = ["BenchConfig", "parse_size", "message_sizes"]
__all__ += ["DEFAULT_MODELS", "COLLECTIVES"]

#: Defaults that cover both regimes: a wide MLP sends one large gradient message (4.5 MB) per
#: step; the CNN (0.08 MB) and the transformer (0.4 MB over ~30 tensors) send small ones.
DEFAULT_MODELS = ("mlp:width=1024", "cnn", "transformer")
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast")
SCALINGS = ("weak", "strong")

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1024,
    "KB": 1024,
    "KIB": 1024,
    "M": 1024**2,
    "MB": 1024**2,
    "MIB": 1024**2,
    "G": 1024**3,
    "GB": 1024**3,
    "GIB": 1024**3,
}


def parse_size(text: str) -> int:
    """Bytes from `4096`, `4K`, `64M` or `1G` (powers of 1024, as nccl-tests' -b/-e take them)."""
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).upper() not in _UNITS:
        raise ConfigurationError(f"message size {text!r} is not a number of bytes like 4096, 4K, 64M or 1G.")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def message_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """min_bytes, 4 * min_bytes, 16 * min_bytes, ... up to max_bytes (nccl-tests' -b, -e, -f 4)."""
    if min_bytes < 4 or max_bytes < min_bytes:
        raise ConfigurationError(f"message sizes {min_bytes}..{max_bytes} B: need 4 <= min <= max.")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size - size % 4)  # whole float32 elements
        size *= 4
    return sizes


@dataclass
class BenchConfig:
    """Everything one `paraflow bench` run does.

    Attributes:
        backends: backend names to run (None: every one available here, see matrix.py).
        nprocs: process counts for multi-process backends (single and dp always run one).
        models: model specs, see ModelSpec.
        input_shape: one sample's shape for a factory that returns a bare nn.Module.
        classes: classes of the synthetic batch made for such a module.
        script: a paraflow training script timed instead of the models (script mode).
        script_args: the script's arguments.
        horovod_api: the script is written for ``horovod.torch``: its import of it imports
            ``paraflow.compat.horovod`` (``paraflow run --horovod-api``).
        data: "synthetic" (default) or "digits".
        batch_size: samples per process per step (weak scaling: fixed per rank).
        warmup: untimed steps before each timed window, at least; warm-up goes on until step
            times settle, for at most max_warmup seconds of steps.
        max_warmup: seconds of warm-up steps, at most.
        steps: timed steps in the throughput window, at least.
        min_window: seconds the throughput window lasts, at least (more steps when they are
            short); the communication-overhead phase then runs half as many sync/no-sync pairs.
        repeat: independent launches of every training cell (intervals come from their spread).
        max_repeat: launches a cell may get in all when its interval stays wider than `noisy`
            after `repeat` (runner.run_extra_launches; None: `repeat`, no extra launch).
        time_budget: extra launches start only while the run has taken less than this many
            seconds, counting the launch about to start.
        threads: torch threads per process, the same at every process count, so that a rank of N
            processes computes as the one-process baseline does and weak-scaling efficiency
            measures parallel cost only (None: the cores divided by the largest process count).
        noisy: relative half-width of a 95% interval above which a figure is marked noisy.
        margin: the smallest throughput difference the verdict calls (a fraction; the A/A noise
            floor when that is larger): a smaller one is within what the machine drifts between runs.
        aa_check: launch the first training cell twice more at the start (A/A): the machine's noise floor.
        scaling: "weak" (fixed batch per process), "strong" (fixed global batch) or both.
        sizes: collective sweep message sizes in bytes.
        collectives: collectives the sweep measures.
        launchers: restrict to these launchers (None: each backend's own).
        timeout: seconds each launch may take before its whole process group is killed.
        out: results folder.
        plots: write throughput.png (needs matplotlib).
        allreduce: run the collective sweep.
        seed: model initialisation and data seed.
        cluster: run on an emulated cluster of this many hosts, one rank per host (0: no cluster);
            multi-process cells then have exactly that many processes.
        bandwidth: each host link's rate on the emulated cluster, in tc notation (1gbit).
        compile: "no", "yes" or both: each training cell eager, compiled (``wrap_model(model,
            compile=True)``), or both side by side.
    """

    backends: Optional[list] = None
    nprocs: list = field(default_factory=lambda: [1, 2])
    models: list = field(default_factory=lambda: [ModelSpec.parse(m) for m in DEFAULT_MODELS])
    input_shape: Optional[tuple] = None
    classes: int = 10
    script: Optional[str] = None
    script_args: list = field(default_factory=list)
    horovod_api: bool = False
    data: str = "synthetic"
    batch_size: int = 32
    warmup: int = 5
    max_warmup: float = 1.5
    steps: int = 20
    min_window: float = 0.3
    repeat: int = 3
    max_repeat: Optional[int] = None
    time_budget: float = 270.0
    threads: Optional[int] = None
    noisy: float = 0.10
    margin: float = DEFAULT_MARGIN
    aa_check: bool = True
    scaling: list = field(default_factory=lambda: ["weak"])
    sizes: list = field(default_factory=lambda: message_sizes(4 * 1024, 64 * 1024**2))
    collectives: list = field(default_factory=lambda: ["allreduce"])
    launchers: Optional[list] = None
    timeout: float = 150.0
    out: str = "bench-results"
    plots: bool = True
    allreduce: bool = True
    seed: int = 0
    cluster: int = 0
    bandwidth: Optional[str] = None
    compile: list = field(default_factory=lambda: ["no"])

    def __post_init__(self) -> None:
        from ...examples.data import DATASETS

        if self.data not in DATASETS:
            raise ConfigurationError(f"unknown data {self.data!r}; choose one of {', '.join(DATASETS)}.")
        self.max_repeat = self.repeat if self.max_repeat is None else self.max_repeat
        for name, value, low in (
            ("batch_size", self.batch_size, 1),
            ("steps", self.steps, 1),
            ("warmup", self.warmup, 0),
            ("repeat", self.repeat, 1),
            ("max_repeat", self.max_repeat, int(self.repeat)),
            ("time_budget", self.time_budget, 1),
            ("threads", 1 if self.threads is None else self.threads, 1),
        ):
            if int(value) < low:
                raise ConfigurationError(f"{name}={value}: must be at least {low}.")
        if not self.nprocs or any(int(n) < 1 for n in self.nprocs):
            raise ConfigurationError(f"process counts {self.nprocs}: give positive integers, e.g. --nprocs 1,2.")
        if not self.models:
            raise ConfigurationError("no models to benchmark; give at least one, e.g. --model mlp.")
        if not self.compile or set(self.compile) - {"no", "yes"}:
            raise ConfigurationError(f"compile={self.compile}: give no, yes or no,yes (e.g. --compile no,yes).")
        if self.min_window < 0:
            raise ConfigurationError(f"min_window={self.min_window}: must be zero or more seconds.")
        if self.timeout <= 0:
            raise ConfigurationError(f"timeout={self.timeout}: must be positive seconds.")
        for name, values, known in (
            ("scaling", self.scaling, SCALINGS),
            ("collectives", self.collectives, COLLECTIVES),
        ):
            wrong = [v for v in values if v not in known] or ([] if values else ["(none)"])
            if wrong:
                raise ConfigurationError(
                    f"{name} {', '.join(wrong)}: choose from {', '.join(known)} (e.g. --{name} {known[0]})."
                )
        if not 0 < self.noisy < 1:
            raise ConfigurationError(f"noisy={self.noisy}: give a fraction between 0 and 1, e.g. --noisy 0.1.")
        if not 0 <= self.margin < 1:
            raise ConfigurationError(f"margin={self.margin}: give a fraction from 0 up to 1, e.g. --margin 0.05.")
        if self.bandwidth and not self.cluster:
            raise ConfigurationError(f"--bandwidth {self.bandwidth} shapes cluster links: add --nodes 2.")
        if self.cluster:
            if int(self.cluster) < 2:
                raise ConfigurationError(f"--nodes {self.cluster}: an emulated cluster needs 2 or more hosts.")
            self.nprocs = [int(self.cluster)]
        if "strong" in self.scaling:
            uneven = [n for n in self.nprocs if int(n) > 0 and self.batch_size % int(n)]
            if uneven:
                raise ConfigurationError(
                    f"strong scaling splits --batch-size {self.batch_size} over the processes, but it does not "
                    f"divide by {', '.join(map(str, uneven))}; pick a batch size that does (e.g. --batch-size 64)."
                )
        self.nprocs = sorted({int(n) for n in self.nprocs})
        self.models = [m if isinstance(m, ModelSpec) else ModelSpec.parse(m) for m in self.models]
        if self.input_shape is not None:
            self.input_shape = tuple(int(s) for s in self.input_shape)
        if int(self.classes) < 1:
            raise ConfigurationError(f"classes={self.classes}: give at least 1 (--classes 10).")
        if self.horovod_api and not self.script:
            raise ConfigurationError("--horovod-api runs a script written for Horovod: add --script PATH.")
        if self.script:
            self._script_mode()

    def _script_mode(self) -> None:
        """--script: the script is the one thing trained; what needs the built-in loop is left out."""
        from pathlib import Path

        if not Path(self.script).is_file():
            raise ConfigurationError(f"--script {self.script}: no such file; give the path of your training script.")
        if self.scaling != ["weak"] or self.compile != ["no"]:
            raise ConfigurationError(
                "--script times your script as it is: --scaling strong and --compile need the "
                "built-in loop (drop them, or benchmark a --model instead; a script compiles its model itself)."
            )
        self.models = [ModelSpec(str(self.script), (), "script")]
        self.allreduce = False

    def to_dict(self) -> dict:
        """JSON-ready copy, models written as specs."""
        d = dict(vars(self))
        d["models"] = [str(m) for m in self.models]
        return d
