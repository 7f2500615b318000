"""Who is this process? Rank, world size and rank 0's address, read from the launcher.

One :class:`Launcher` per launcher, each in a module of this package, registered in a fixed
priority; the first whose :meth:`Launcher.detect` accepts the environment wins: torchrun,
paraflow.launch, torch's plain env:// (a PyTorchJob's pods), SLURM srun, Open MPI, MPICH / Intel
MPI, MVAPICH2, horovodrun, LSF jsrun, and no launcher (plain python) last. Adding a launcher is a
module with a Launcher subclass and a :func:`register_launcher` call. This package knows about
environment variables only, never about a backend.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Optional

from ...errors import ConfigurationError, LauncherError
from .base import HostCommand, Identity, Launcher, ProcessEnvironment, free_port
from .env_init import EnvInit
from .horovodrun import Horovodrun
from .lsf import LSF
from .mpich import MPICH
from .mvapich2 import MVAPICH2
from .openmpi import OpenMPI
from .plain import Plain
from .slurm import Slurm, expand_hostlist
from .spawn import ParaflowLaunch
from .torchrun import Torchrun

__all__ = [
    "HostCommand",
    "Identity",
    "Launcher",
    "ProcessEnvironment",
    "detect_environment",
    "detect_launcher",
    "expand_hostlist",
    "free_port",
    "get_launcher",
    "job_key",
    "launcher_for_tool",
    "launcher_label",
    "launcher_tools",
    "launcher_variables",
    "register_launcher",
    "registered_launchers",
]

# Fixed priority: torchrun often runs inside an srun allocation, so it comes first; paraflow.launch's
# workers have names of their own, so a torchrun started inside one still wins; the plain env://
# contract is torchrun's variables without its own marks; no launcher comes last.
_LAUNCHERS: list[Launcher] = [
    Torchrun(),
    ParaflowLaunch(),
    EnvInit(),
    Slurm(),
    OpenMPI(),
    MPICH(),
    MVAPICH2(),
    Horovodrun(),
    LSF(),
    Plain(),
]


def register_launcher(launcher: Launcher, before: Optional[str] = None) -> Launcher:
    """Add `launcher` to the detection order, before the one named `before` (default: before no
    launcher at all, i.e. after every other); a launcher of the same name is replaced."""
    if not launcher.name:
        raise ConfigurationError(f"{type(launcher).__name__} has no name.")
    _LAUNCHERS[:] = [x for x in _LAUNCHERS if x.name != launcher.name]
    names = [x.name for x in _LAUNCHERS]
    at = names.index(before) if before in names else len(_LAUNCHERS) - 1
    _LAUNCHERS.insert(at, launcher)
    return launcher


def unregister_launcher(name: str) -> None:
    """Remove the launcher `name` from the detection order (a test's own launcher)."""
    _LAUNCHERS[:] = [x for x in _LAUNCHERS if x.name != name]


def registered_launchers() -> tuple:
    """Every launcher, in detection order."""
    return tuple(_LAUNCHERS)


def get_launcher(name: str) -> Launcher:
    """The launcher registered as `name`; ConfigurationError listing the known ones otherwise."""
    for launcher in _LAUNCHERS:
        if launcher.name == name:
            return launcher
    raise ConfigurationError(f"unknown launcher {name!r}; known: {', '.join(x.name for x in _LAUNCHERS)}.")


def launcher_for_tool(tool: str) -> Launcher:
    """The launcher paraflow starts with the program `tool` (torchrun, mpirun, horovodrun, srun, python)."""
    for launcher in _LAUNCHERS:
        if launcher.tool == tool:
            return launcher
    raise ConfigurationError(f"unknown launcher {tool!r}; choose one of {', '.join(launcher_tools())}.")


def launcher_tools(multihost: bool = False) -> tuple:
    """The programs paraflow starts jobs with (``paraflow run --launcher``, the benchmark's
    launchers), in detection order; only those that span hosts with `multihost`."""
    return tuple(x.tool for x in _LAUNCHERS if x.tool and (x.multihost or not multihost))


def launcher_label(name: str) -> str:
    """How the banner names the launcher `name` (``mpirun (Open MPI)`` for openmpi)."""
    launcher = next((x for x in _LAUNCHERS if x.name == name), None)
    return (launcher.label or launcher.name) if launcher else name


def launcher_variables(env: Mapping[str, str]) -> list:
    """The names in `env` a launcher set: to remove before starting a new job from inside one."""
    prefixes = tuple(p for x in _LAUNCHERS for p in x.variable_prefixes)
    names = {n for x in _LAUNCHERS for n in x.variables()}
    return [key for key in env if key.startswith(prefixes) or key in names]


def detect_launcher(env: Optional[Mapping[str, str]] = None) -> Launcher:
    """The launcher that started this process (no launcher: the plain one)."""
    env = os.environ if env is None else env
    return next(x for x in _LAUNCHERS if x.detect(env))


def detect_environment(env: Optional[Mapping[str, str]] = None) -> ProcessEnvironment:
    """Read this process's launcher, rank and world size from the environment.

    Raises:
        LauncherError: a launcher's variables are half-set or inconsistent.
    """
    env = os.environ if env is None else env
    launcher = detect_launcher(env)
    if launcher.is_plain:
        stray = [k for x in _LAUNCHERS for k in x.stray_variables if k in env]
        if stray:
            stray = list(dict.fromkeys(stray))
            raise LauncherError(
                f"found {', '.join(f'{k}={env[k]}' for k in stray)} but no rank variable, so no launcher "
                f"started this process. Launch with `torchrun --nproc_per_node N train.py` or "
                f"`mpirun -np N python train.py`, or unset {', '.join(stray)} to run one process."
            )
    return launcher.environment(env)


def job_key(env: Mapping[str, str]) -> Optional[str]:
    """A name of this job that every local rank finds the same: the detected launcher's, else
    MASTER_ADDR and MASTER_PORT, else None."""
    try:
        key = detect_launcher(env).job_key(env)
    except Exception:  # noqa: BLE001 - a half-set environment names no job
        key = None
    if key is None and env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        key = f"{env['MASTER_ADDR']}-{env['MASTER_PORT']}"
    return key
