"""Who is this process? Rank, world size and rank 0's address, read from the launcher.

Launchers are tried in a fixed priority; the first whose variables are present wins:
torchrun, paraflow.launch, SLURM srun, Open MPI, MPICH / Intel MPI, MVAPICH2, horovodrun, plain python.
This module knows about environment variables only, never about a backend.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from ..errors import LauncherError

__all__ = [
    "MPI_LAUNCHERS",
    "ProcessEnvironment",
    "detect_environment",
    "LAUNCHERS",
    "Launcher",
    "launcher_tools",
    "launcher_label",
    "expand_hostlist",
    "launcher_variables",
]


@dataclass(frozen=True)
class ProcessEnvironment:
    """This process's place in the job, as the launcher described it."""

    launcher: str
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: Optional[str] = None
    master_port: Optional[int] = None

    @property
    def is_distributed(self) -> bool:
        """True when the launcher started more than one process."""
        return self.world_size > 1

    @property
    def is_mpi(self) -> bool:
        """True when an MPI launcher (mpirun, mpiexec) started this process."""
        return self.launcher in MPI_LAUNCHERS


@dataclass(frozen=True)
class Launcher:
    """One launcher: the variables it sets (`rank` decides whether it started this process) and,
    for those paraflow starts itself, the program (`tool`) ``paraflow run``, multi-host jobs and the
    benchmark run."""

    name: str  # as ProcessEnvironment.launcher names it
    command: str  # how a user starts a job with it (for messages)
    rank: Optional[str]
    world_size: Optional[str]
    local_rank: Optional[str]
    local_world_size: Optional[str]
    label: str = ""  # for the banner, when not the name
    tool: Optional[str] = None  # the program paraflow starts jobs with (None: paraflow never starts it)
    multihost: bool = False  # paraflow can start it on several hosts
    mpi: bool = False  # an MPI implementation (ranks share an MPI communicator)


# Fixed priority: torchrun often runs inside an srun allocation, so it comes first.
_RANK_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
LAUNCHERS = (
    Launcher("torchrun", "torchrun --nproc_per_node N train.py", *_RANK_NAMES, tool="torchrun", multihost=True),
    # paraflow.launch's workers: their own names, so a torchrun started inside one still wins.
    Launcher("paraflow-launch", "paraflow.launch(fn, nprocs=N)", *(f"PARAFLOW_{n}" for n in _RANK_NAMES)),
    Launcher(
        "slurm",
        "srun -n N python train.py",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        None,
        label="srun",
        tool="srun",
    ),
    Launcher(
        "openmpi",
        "mpirun -np N python train.py",
        *(f"OMPI_COMM_WORLD_{n}" for n in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE")),
        label="mpirun (Open MPI)",
        tool="mpirun",
        multihost=True,
        mpi=True,
    ),
    Launcher(
        "mpich",
        "mpiexec -n N python train.py",
        "PMI_RANK",
        "PMI_SIZE",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
        label="mpiexec (MPICH)",
        mpi=True,
    ),
    Launcher(
        "mvapich2",
        "mpirun_rsh -np N python train.py",
        *(f"MV2_COMM_WORLD_{n}" for n in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE")),
        label="mpirun (MVAPICH2)",
        mpi=True,
    ),
    Launcher(
        "horovodrun",
        "horovodrun -np N --gloo python train.py",
        *(f"HOROVOD_{n}" for n in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE")),
        tool="horovodrun",
        multihost=True,
    ),
    # No launcher: one process, or ranks started by hand (read last, when no launcher's rank is set).
    Launcher("python", "python train.py", None, None, None, None, label="no launcher (plain python)", tool="python"),
)
#: Launchers that are MPI implementations (ranks share an MPI communicator).
MPI_LAUNCHERS = tuple(launcher.name for launcher in LAUNCHERS if launcher.mpi)


def launcher_tools(multihost: bool = False) -> tuple:
    """The programs paraflow starts jobs with (``paraflow run --launcher``, the benchmark's
    launchers), in the table's order; only those that span hosts with `multihost`."""
    return tuple(x.tool for x in LAUNCHERS if x.tool and (x.multihost or not multihost))


def launcher_label(name: str) -> str:
    """How the banner names the launcher `name` (``mpirun (Open MPI)`` for openmpi)."""
    return next((x.label for x in LAUNCHERS if x.name == name and x.label), name)


# Every variable a launcher sets for the processes it starts: the table's, torchrun's others, and
# whole families of MPI's and SLURM's.
_LAUNCHER_PREFIXES = ("OMPI_COMM_WORLD_", "PMI_", "PMIX_", "SLURM_", "HOROVOD_", "MV2_COMM_WORLD_", "MPI_LOCAL")
_LAUNCHER_NAMES = {
    *(name for x in LAUNCHERS for name in (x.rank, x.world_size, x.local_rank, x.local_world_size) if name),
    *("GROUP_RANK", "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"),
}


def launcher_variables(env: Mapping[str, str]) -> list:
    """The names in `env` a launcher set: to remove before starting a new job from inside one."""
    return [key for key in env if key.startswith(_LAUNCHER_PREFIXES) or key in _LAUNCHER_NAMES]


# Variables whose presence alone, without the rest of a launcher's set, means a half-set environment.
_STRAY = ("WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "HOROVOD_SIZE", "PARAFLOW_WORLD_SIZE")


def _int(env: Mapping[str, str], key: str, launcher: Launcher) -> int:
    value = env.get(key)
    if value is None or value == "":
        raise LauncherError(
            f"{launcher.name} environment is half-set: {launcher.rank} is present but {key} is "
            f"missing. Start the job with its launcher (`{launcher.command}`) instead of setting "
            f"variables by hand, or set every one of them."
        )
    try:
        return int(value)
    except ValueError:
        raise LauncherError(f"{key}={value!r} is not an integer (set by {launcher.name}?).") from None


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a SLURM host list such as ``node[01-03,07],gpu1`` into host names."""
    hosts: list[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", hostlist):
        prefix, ranges = match.group(1), match.group(2)
        if not ranges:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                hosts.extend(f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1))
            else:
                hosts.append(prefix + part)
    return hosts


def _slurm_local_size(env: Mapping[str, str]) -> int:
    """Tasks on this node, from SLURM's compressed per-node counts such as ``4(x2),3``."""
    if env.get("SLURM_NTASKS_PER_NODE"):
        return int(env["SLURM_NTASKS_PER_NODE"])
    counts: list[int] = []
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    for item in filter(None, spec.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if m:
            counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    node = int(env.get("SLURM_NODEID", "0"))
    return counts[node] if node < len(counts) else 1


def _master(launcher: str, env: Mapping[str, str]) -> tuple[Optional[str], Optional[int]]:
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if launcher == "slurm" and not addr:
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        addr = expand_hostlist(nodes)[0] if nodes else None
        if not port and env.get("SLURM_JOB_ID"):
            port = str(15000 + int(env["SLURM_JOB_ID"]) % 20000)
    if launcher == "horovodrun" and not addr:
        addr = env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    return addr, int(port) if port else None


def detect_environment(env: Optional[Mapping[str, str]] = None) -> ProcessEnvironment:
    """Read this process's launcher, rank and world size from the environment.

    Raises:
        LauncherError: a launcher's variables are half-set or inconsistent.
    """
    env = os.environ if env is None else env
    for launcher in LAUNCHERS:
        if launcher.rank is None or launcher.rank not in env:
            continue
        rank = _int(env, launcher.rank, launcher)
        world = _int(
            env,
            "SLURM_STEP_NUM_TASKS"
            if launcher.name == "slurm" and "SLURM_STEP_NUM_TASKS" in env
            else launcher.world_size,
            launcher,
        )
        local_rank = _int(env, launcher.local_rank, launcher) if launcher.local_rank else 0
        if launcher.local_world_size and launcher.local_world_size in env:
            local_world = _int(env, launcher.local_world_size, launcher)
        elif launcher.name == "slurm":
            local_world = _slurm_local_size(env)
        else:
            local_world = world
        if world < 1 or not 0 <= rank < world or not 0 <= local_rank < max(local_world, 1):
            raise LauncherError(
                f"inconsistent {launcher.name} environment: rank {rank}, world size {world}, "
                f"local rank {local_rank}, local size {local_world}. Relaunch with `{launcher.command}`."
            )
        addr, port = _master(launcher.name, env)
        return ProcessEnvironment(launcher.name, rank, world, local_rank, local_world, addr, port)
    stray = [k for k in _STRAY if k in env]
    if stray:
        raise LauncherError(
            f"found {', '.join(f'{k}={env[k]}' for k in stray)} but no rank variable, so no launcher "
            f"started this process. Launch with `torchrun --nproc_per_node N train.py` or "
            f"`mpirun -np N python train.py`, or unset {', '.join(stray)} to run one process."
        )
    return ProcessEnvironment(
        "python",
        master_addr=env.get("MASTER_ADDR"),
        master_port=int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else None,
    )


def free_port(host: str = "") -> int:
    """A TCP port free on this host right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
