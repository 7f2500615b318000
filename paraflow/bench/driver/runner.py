"""Launch every cell with its own launcher and a timeout, gather per-rank JSON, keep going on failure.

More launches for the cells whose intervals are still wide, while the run's time budget lasts.

After the planned rounds, a training cell whose step-time or throughput interval is wider than
``--noisy`` on any of its models (its row's noisy mark) is launched once more, round after round
(the widest first), judged again after each round, until its intervals narrow, it has
``--max-repeat`` launches, or the run's time is spent: a launch starts only when the run's time
so far plus that cell's mean launch time stays within ``--time-budget``. Three launches give a t
interval 4.30 standard errors wide on each side; five give 2.78, over more launches. Extra
launches skip the collective sweep, whose rows keep the planned launches.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from ...environment.launchers import launcher_for_tool, launcher_variables
from ...environment.launchers.openmpi import MPI_YIELD
from ...tools.launch import launch_command, run_launch
from ..report.tables import training_rows
from .config import BenchConfig
from .matrix import Cell
from .progress import LaunchProgress
from .scratch import launch_scratch

__all__ = [
    "CellResult",
    "run_cells",
    "worker_entry",
    "script_cell",
    "worker_args",
    "cell_env",
    "failure_reason",
    "command_line",
    "wide_groups",
    "launch_cost",
    "run_extra_launches",
]

WORKER_MODULE = "paraflow.bench.rank.worker"
_TAIL = 4000
OMP_WAIT = "OMP_WAIT_POLICY"


@dataclass
class CellResult:
    """What one launch produced: status ("ok", "failed", "timed out"), error, per-rank JSON."""

    cell: Cell
    command: list
    status: str
    error: Optional[str]
    elapsed_s: float
    ranks: list = field(default_factory=list)
    stdout_tail: str = ""
    stderr_tail: str = ""
    env: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        """JSON-ready: the cell, the exact command, the outcome and the raw per-rank numbers."""
        c = self.cell
        return {
            "id": c.id,
            "group": c.group,
            "repeat": c.repeat,
            "tag": c.tag,
            "kind": c.kind,
            "backend": c.backend,
            "launcher": c.launcher,
            "nproc": c.nproc,
            "threads": c.threads,
            "models": [str(m) for m in c.models],
            "sweep": c.sweep,
            "compiled": c.compiled,
            "command": command_line(self.command, self.env),
            "status": self.status,
            "error": self.error,
            "elapsed_s": self.elapsed_s,
            "stdout_tail": self.stdout_tail,
            "stderr_tail": self.stderr_tail,
            "ranks": self.ranks,
        }


def command_line(command: list, env: dict) -> str:
    """The launch as a shell line, variables it sets or removes included: `env -u X A=1 cmd ...`.

    A launch on an emulated cluster has one command per host (a list each): they run together.
    """
    if command and isinstance(command[0], list):
        return " & ".join(command_line(part, env) for part in command)
    unset = [arg for key, value in env.items() if value is None for arg in ("-u", key)]
    assign = [f"{key}={value}" for key, value in env.items() if value is not None]
    return shlex.join((["env", *unset] if unset else []) + assign + list(command))


#: The BenchConfig fields a rank reads (train_loop.run_training's settings), as they are.
TASK_FIELDS = ("data", "batch_size", "warmup", "max_warmup", "steps", "min_window", "seed", "scaling")
TASK_FIELDS += ("input_shape", "classes", "collectives")


def worker_args(cell: Cell, config: BenchConfig, out_dir: Path) -> list:
    """The worker's arguments for `cell` (everything after the module name): its folder and its task."""
    task = {key: getattr(config, key) for key in TASK_FIELDS}
    task.update(backend=cell.backend, models=[str(m) for m in cell.models], compile=cell.compiled)
    task["sweep_sizes"] = config.sizes if cell.sweep else []
    return ["--out", str(out_dir), "--task", json.dumps(task, separators=(",", ":"))]


def worker_entry(cell: Cell, config: BenchConfig, out_dir: Path) -> list:
    """What the launcher starts: `-m paraflow.bench.rank.worker` and its arguments, or your
    --script and its arguments (script_hook.py times it from inside)."""
    if script_cell(cell):
        return [config.script, *config.script_args]
    return ["-m", WORKER_MODULE, *worker_args(cell, config, out_dir)]


def script_cell(cell: Cell) -> bool:
    """Whether `cell` runs your --script rather than the built-in loop."""
    return cell.kind == "train" and any(spec.kind == "script" for spec in cell.models)


def _script_env(cell: Cell, config: BenchConfig, out_dir: Path) -> dict:
    """For a script cell: the backend to start and the step counter paraflow.init installs."""
    if not script_cell(cell):
        return {}
    from ..rank.script_hook import script_env

    task = f"train/{cell.models[0]}"
    env = {"PARAFLOW_BACKEND": cell.backend, **script_env(out_dir, config.warmup, config.steps, task)}
    if config.horovod_api:
        from ...tools.horovod_api import environment

        env.update(environment(cell_env(cell, config.timeout)))
    return env


def cell_env(cell: Cell, timeout: float) -> dict:
    """Variables for the cell's processes: threads per rank, unbuffered output, no inherited ranks."""
    threads = str(cell.threads)
    package_root = str(Path(__file__).resolve().parents[3])
    # the current directory too: your --model factories import from there, as they did in the driver
    path = os.pathsep.join(dict.fromkeys(filter(None, [package_root, os.getcwd(), os.environ.get("PYTHONPATH")])))
    inherited = launcher_variables(os.environ) + ["PARAFLOW_BACKEND"]  # a parent job's, not the cell's
    env = {key: None for key in inherited if key in os.environ}
    env.update(
        {
            "PARAFLOW_NUM_THREADS": threads,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": path,
            "PARAFLOW_TIMEOUT": str(int(max(timeout, 1))),
        }
    )
    if OMP_WAIT not in os.environ:
        # Sleeping threads at barriers: spinning ones made a lone 2-thread step faster, but fought the
        # launchers' own processes for the cores: two runs disagreed far more, and on a busy machine
        # they were 2-5 times slower, erratic.
        env[OMP_WAIT] = "PASSIVE"
    if launcher_for_tool(cell.launcher).mpi and MPI_YIELD not in os.environ:
        # The cell fills every core, and each horovod rank adds a background thread: Open MPI's
        # default busy-polling would starve the other threads (it yields by itself only when it
        # knows there are more ranks than slots).
        env[MPI_YIELD] = "1"
    return env


# Rank prefixes: horovodrun's "[1]<stderr>:", torchrun's "[rank1]:".
_ERROR_LINE = re.compile(
    r"^(?:\[\d+\]<std\w+>:|\[rank\d+\]:)?\s*((?:[\w.]*(?:Error|Exception|Interrupt)|SystemExit)(?::\s.*)?)$"
)
_LAUNCHER_WRAPPERS = ("ChildFailedError", "CalledProcessError")


def failure_reason(stderr: str, returncode: Optional[int]) -> str:
    """The most telling line of a failed launch: the root exception, else the last line of output."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [m.group(1) for m in map(_ERROR_LINE.match, lines) if m]
    errors = [e for e in errors if not any(w in e for w in _LAUNCHER_WRAPPERS)]
    if errors:
        return errors[-1][:400]
    return lines[-1][:400] if lines else f"exit status {returncode}, no error output"


def _read_ranks(out_dir: Path, nproc: int) -> tuple[list, list]:
    ranks, missing = [], []
    for r in range(nproc):
        path = out_dir / f"rank{r}.json"
        try:
            ranks.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            missing.append(r)
    return ranks, missing


def run_cell(
    cell: Cell,
    config: BenchConfig,
    raw_dir: Path,
    timeout: float,
    entry: Callable[[Cell, BenchConfig, Path], list] = worker_entry,
    cluster=None,
) -> CellResult:
    """Launch one cell (on `cluster`'s hosts when given) and collect what its ranks wrote; never
    raises for a failed launch."""
    out_dir = raw_dir / cell.id
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("rank*.json"):
        old.unlink()
    env = {**cell_env(cell, timeout), **_script_env(cell, config, out_dir)}
    start = time.monotonic()
    try:
        if cluster is not None:
            from .on_cluster import run_on_cluster

            command, result = run_on_cluster(cluster, cell, entry(cell, config, out_dir), env, timeout)
            return _outcome(cell, command, result, out_dir, timeout, env)
        command = launch_command(
            cell.launcher,
            cell.nproc,
            entry(cell, config, out_dir),
            env_keys=[k for k, v in env.items() if v is not None and not k.startswith("OMPI_MCA_")],
        )
    except Exception as exc:  # a launcher that is not installed, a bad process count
        return CellResult(
            cell, [cell.launcher], "failed", f"{type(exc).__name__}: {exc}", time.monotonic() - start, env=env
        )
    with launch_scratch() as scratch:  # not in the recorded command: the directories are gone after
        result = run_launch(command, timeout=timeout, env={**env, **scratch})
    return _outcome(cell, command, result, out_dir, timeout, env)


def _outcome(cell: Cell, command: list, result, out_dir: Path, timeout: float, env: dict) -> CellResult:
    """The cell's status and error from its launch's result and the rank files it left."""
    ranks, missing = _read_ranks(out_dir, cell.nproc)
    if result.timed_out:
        error = f"timed out after {timeout:.0f} s (every process of the launch was killed)"
        if result.stderr.strip():
            error += f"; last output: {failure_reason(result.stderr, None)}"
        status = "timed out"
    elif result.returncode != 0:
        status, error = "failed", f"exit status {result.returncode}: {failure_reason(result.stderr, result.returncode)}"
    elif any(r.get("error") for r in ranks):
        status, error = "failed", next(f"rank {r.get('rank')}: {r['error']}" for r in ranks if r.get("error"))
    elif missing and script_cell(cell):
        status, error = (
            "failed",
            (
                f"rank(s) {', '.join(map(str, missing))} wrote no results: the script never called paraflow.init(), "
                "which starts the benchmark's step counter (call it with no name: the benchmark picks the backend)"
            ),
        )
    elif missing:
        status, error = "failed", f"rank(s) {', '.join(map(str, missing))} wrote no results"
    else:
        status, error = "ok", None
    return CellResult(
        cell,
        command,
        status,
        error,
        result.elapsed_s,
        ranks,
        result.stdout[-_TAIL:] if status != "ok" else "",
        result.stderr[-_TAIL:] if status != "ok" else "",
        env,
    )


def run_cells(
    cells: list,
    config: BenchConfig,
    raw_dir: Path,
    tracker: LaunchProgress,
    entry: Callable[[Cell, BenchConfig, Path], list] = worker_entry,
    cluster=None,
    heading: Optional[str] = None,
) -> list:
    """Run `cells` one after another, showing progress on `tracker`; a failed or hung cell does
    not stop the rest. Each line starts with `heading` instead of the launch's place when given."""
    results = []
    for cell in cells:
        tracker.begin(cell.label, heading)
        result = run_cell(cell, config, raw_dir, config.timeout, entry, cluster)
        results.append(result)
        outcome = "ok" if result.ok else f"{result.status.upper()}: {result.error}"
        tracker.end(result.ok, outcome, result.elapsed_s)
    return results


def wide_groups(cells: list, noisy: float, scaling: tuple) -> list:
    """Groups (``backend-launcher-processes``) of default training rows whose step-time or
    throughput interval is wider than `noisy` (their noisy mark; the communication share is not a
    verdict's), the widest first, so a budget that runs short goes to the cells that need
    launches most."""
    rows, estimates = training_rows(cells, tuple(scaling), noisy)
    widths: dict = {}
    for row, est in zip(rows, estimates):
        if not est:
            continue
        width = max(est["step"].halfwidth, est["x"].halfwidth)
        if width > noisy:
            group = f"{row['backend']}-{row['launcher']}-{row['processes']}"
            widths[group] = max(widths.get(group, 0.0), width)
    return sorted(widths, key=lambda group: -widths[group])


def launch_cost(cells: list, group: str) -> float:
    """Mean seconds of the launches of `group` so far."""
    spent = [c["elapsed_s"] for c in cells if c.get("group") == group and c["kind"] == "train" and not c.get("tag")]
    return statistics.fmean(spent) if spent else 0.0


def run_extra_launches(
    planned: list, results: list, config: BenchConfig, started: float, launch: Callable[[Cell], list]
) -> list:
    """Launch the still-wide cells of `planned` again (see the module's docstring); returns the
    new launches' results. `launch(cell)` runs one cell and returns its results (run_cells);
    `started` is the run's time.monotonic() start."""
    cells = {c.group: c for c in planned if c.kind == "train" and c.repeat and not c.tag}
    extra: list = []
    for repeat in range(config.repeat + 1, config.max_repeat + 1):
        done = [r.to_dict() for r in results + extra]
        launched = len(extra)
        for group in wide_groups(done, config.noisy, config.scaling):
            if group in cells and time.monotonic() - started + launch_cost(done, group) <= config.time_budget:
                extra += launch(replace(cells[group], repeat=repeat, sweep=False))
        if len(extra) == launched:  # nothing wide, or nothing that fits the time left
            break
    return extra
