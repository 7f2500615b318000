"""What ``paraflow run`` will start: the launcher a backend wants, on which hosts, with which environment.

The backend class says which launchers it is started with (``LAUNCHERS``, preferred first);
inside a SLURM allocation multi-process backends go through ``srun``. The command lines
themselves come from :func:`paraflow.tools.launch.launch_command`, the one place that knows
each launcher's syntax.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional

from ..core.placement import cores
from ..environment.launchers import launcher_tools, launcher_variables
from ..errors import ConfigurationError
from .launch import find_tool, launch_command

__all__ = ["RUN_LAUNCHERS", "RunPlan", "parse_hosts", "choose_launcher", "plan_run"]

RUN_LAUNCHERS = ("auto", *launcher_tools())
MPI_YIELD = "OMPI_MCA_mpi_yield_when_idle"
#: How the job's processes learn the backend: ``paraflow.init()`` with no name reads it.
BACKEND_VARIABLE = "PARAFLOW_BACKEND"
# A new job's own identity; the allocation's other SLURM_* variables stay, srun and mpirun need them.
_SLURM_TASK = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")


@dataclass
class RunPlan:
    """The launcher, the command per host (one for this host unless torchrun spans several) and the env."""

    backend: str
    launcher: str
    commands: list  # (host or None, argv)
    env: dict = field(default_factory=dict)  # added (value) or removed (None) for the job

    def shown(self, argv: Sequence[str]) -> str:
        """`argv` as a shell line, preceded by the variables the job sets."""
        settings = [f"{k}={shlex.quote(v)}" for k, v in self.env.items() if v is not None]
        return " ".join([*settings, shlex.join(argv)])


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """``"h1:2,h2:2"`` -> ``[("h1", 2), ("h2", 2)]``; a host without a count holds one process."""
    hosts = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = re.fullmatch(r"([^\s:,]+)(?::(\d+))?", item)
        if not match or (match.group(2) is not None and int(match.group(2)) < 1):
            raise ConfigurationError(
                f"--hosts: {item!r} is not HOST or HOST:PROCESSES with PROCESSES >= 1; "
                "write them like --hosts node1:4,node2:4."
            )
        hosts.append((match.group(1), int(match.group(2) or 1)))
    names = [h for h, _ in hosts]
    if not hosts or len(set(names)) != len(names):
        raise ConfigurationError(f"--hosts {text!r}: give each host once, like --hosts node1:4,node2:4.")
    return hosts


def _backend_class(backend: str) -> type:
    from ..core.registry import spec

    return spec(backend).load()


def choose_launcher(backend: str, requested: str, env: Mapping[str, str] = os.environ) -> str:
    """`requested`, or for "auto": srun inside a SLURM allocation, else the backend's first launcher here.

    A backend's later launchers are fallbacks for a first one not installed here (horovod:
    mpirun, else horovodrun --gloo).
    """
    if requested != "auto":
        if requested not in RUN_LAUNCHERS:
            raise ConfigurationError(f"unknown launcher {requested!r}; choose one of {', '.join(RUN_LAUNCHERS)}.")
        return requested
    preferred = tuple(_backend_class(backend).LAUNCHERS)
    if preferred != ("python",) and env.get("SLURM_JOB_ID") and find_tool("srun"):
        return "srun"
    for name in preferred:
        if name in ("python", "torchrun") or find_tool(name):
            return name
    return preferred[0]  # building its command names what to install


def job_environment(launcher: str, nproc_here: int, env: Mapping[str, str] = os.environ) -> dict:
    """Variables to remove (None) or set for the job: no parent job's ranks; MPI yields on full cores."""
    changes: dict = {
        k: None
        for k in launcher_variables(env)
        if not k.startswith("SLURM_") or k in _SLURM_TASK  # a parent job's rank is not this job's
    }
    if launcher == "mpirun" and MPI_YIELD not in env and nproc_here >= cores():
        # Ranks fill every core (horovod adds a thread each): Open MPI's busy polling would starve
        # the other threads, and it yields by itself only when it knows it is oversubscribed.
        changes[MPI_YIELD] = "1"
    return changes


def plan_run(
    script: Sequence[str],
    nproc: Optional[int],
    backend: Optional[str],
    launcher: str = "auto",
    hosts: Optional[str] = None,
    port: Optional[int] = None,
    must_exist: bool = True,
    env: Mapping[str, str] = os.environ,
) -> RunPlan:
    """Plan ``paraflow run``: pick the launcher, hand the backend to `script`, build every command.

    Args:
        script: the Python file and its arguments.
        nproc: total processes (None: the sum over `hosts`, else 1).
        backend: the backend name (None: PARAFLOW_BACKEND, else ddp for several processes, else
            single). The job gets it as PARAFLOW_BACKEND, which ``paraflow.init()`` reads, so
            the script parses nothing; mpirun forwards it to other hosts with ``-x``.
        launcher: "auto" or one of RUN_LAUNCHERS.
        hosts: "h1:2,h2:2" for a multi-host job (None: this host).
        port: rendezvous port of a multi-host torchrun job (default 29500).
        must_exist: False prints launchers missing here by their bare names (``--dry-run``).
    """
    if not script:
        raise ConfigurationError("paraflow run needs a script: paraflow run -n 2 train.py [ARGS...]")
    host_list = parse_hosts(hosts) if hosts else None
    total = sum(n for _, n in host_list) if host_list else None
    nproc = nproc or total or 1
    if nproc < 1:
        raise ConfigurationError(f"-n must be at least 1, got {nproc}.")
    if total is not None and total != nproc:
        raise ConfigurationError(f"-n {nproc} but --hosts {hosts} holds {total} processes; make them agree.")
    name = backend or env.get("PARAFLOW_BACKEND") or ("ddp" if nproc > 1 else "single")
    cls = _backend_class(name)
    if nproc > 1 and not cls.MULTI_PROCESS:
        raise ConfigurationError(
            f"backend {name!r} runs in one process; use -n 1, or a multi-process backend (--backend ddp)."
        )
    chosen = choose_launcher(name, launcher, env)
    args = list(script)
    if host_list and chosen == "torchrun":  # one agent per host: a command for each
        commands = [
            (host, launch_command(chosen, nproc, args, port, hosts=host_list, node_rank=i, must_exist=must_exist))
            for i, (host, _) in enumerate(host_list)
        ]
    else:
        forward = [BACKEND_VARIABLE] if host_list else []  # local ranks inherit it; remote ones need -x
        command = launch_command(chosen, nproc, args, port, env_keys=forward, hosts=host_list, must_exist=must_exist)
        commands = [(None, command)]
    job_env = {BACKEND_VARIABLE: name, **job_environment(chosen, 0 if host_list else nproc, env)}
    return RunPlan(name, chosen, commands, job_env)
