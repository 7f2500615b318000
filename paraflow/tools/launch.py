"""Build and run launcher command lines: torchrun, mpirun, horovodrun, plain python.

Used by the benchmarks and the tests; every run has a timeout and takes its whole process
group down with it, so a hung rank never outlives its launch.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from ..environment.launchers import free_port
from ..errors import ConfigurationError, MissingDependencyError

__all__ = [
    "find_tool",
    "LAUNCHER_NAMES",
    "launch_command",
    "run_launch",
    "LaunchResult",
    "default_launcher",
    "kill_tree",
]

LAUNCHER_NAMES = ("python", "torchrun", "mpirun", "horovodrun")


def find_tool(name: str) -> Optional[str]:
    """The program `name` next to this Python first (a venv's bin), then on PATH; None if absent."""
    local = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(local, os.X_OK):
        return local
    return shutil.which(name)


def _tool(name: str, install_hint: str) -> str:
    """:func:`find_tool`, or MissingDependencyError saying how to install it."""
    found = find_tool(name)
    if not found:
        raise MissingDependencyError(f"`{name}` was not found on PATH; {install_hint}")
    return found


def mpirun_prefix(nproc: int, env_keys: Sequence[str] = ()) -> list[str]:
    """`mpirun -np N` with the flags a one-host run needs (root, more ranks than cores, no binding)."""
    cmd = [
        _tool("mpirun", "install Open MPI: `apt-get install openmpi-bin libopenmpi-dev`"),
        "-np",
        str(nproc),
        "--bind-to",
        "none",
        "--oversubscribe",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for key in env_keys:
        cmd += ["-x", key]
    return cmd


def launch_command(
    launcher: str, nproc: int, script: Sequence[str], port: Optional[int] = None, env_keys: Sequence[str] = ()
) -> list[str]:
    """The command that starts `script` (a Python file and its arguments) as `nproc` processes.

    Args:
        launcher: python, torchrun, mpirun or horovodrun.
        nproc: number of processes (python takes 1 only).
        script: the Python file followed by its arguments.
        port: rendezvous port for torchrun (default: a free one).
        env_keys: variables mpirun must forward to its ranks.
    """
    python = sys.executable
    if launcher == "python":
        if nproc != 1:
            raise ConfigurationError("the python launcher starts exactly one process.")
        return [python, *script]
    if launcher == "torchrun":
        return [
            python,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc_per_node",
            str(nproc),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port or free_port()),
            *script,
        ]
    if launcher == "mpirun":
        return [*mpirun_prefix(nproc, env_keys), python, *script]
    if launcher == "horovodrun":
        tool = _tool("horovodrun", "install horovod: `make install` or scripts/build_horovod.sh")
        return [tool, "-np", str(nproc), "-H", f"localhost:{nproc}", "--gloo", python, *script]
    raise ConfigurationError(f"unknown launcher {launcher!r}; choose one of {', '.join(LAUNCHER_NAMES)}.")


def default_launcher(backend: str, nproc: int) -> str:
    """The launcher a backend is normally started with: the first of its class's LAUNCHERS."""
    from ..core.registry import spec

    return spec(backend).load().LAUNCHERS[0]


@dataclass
class LaunchResult:
    """What one launch did: its exit status, output and whether it ran out of time."""

    command: list
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float
    timed_out: bool

    @property
    def ok(self) -> bool:
        """True when the launch exited 0 in time."""
        return self.returncode == 0 and not self.timed_out


def run_launch(
    command: Sequence[str], timeout: float, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None
) -> LaunchResult:
    """Run `command` in its own process group; on timeout kill it and every process it started.

    `env` is added to this process's environment; a key whose value is None is removed.
    """
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    start = time.monotonic()
    proc = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=cwd,
        start_new_session=True,
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_tree(proc.pid)  # torchrun starts each worker in a session of its own
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # something outside the tree still holds the pipes
            proc.kill()
            out, err = "", "(output lost: a process outside the launch kept its pipes open)"
    except BaseException:  # Ctrl-C or any error here: take every started process down first
        kill_tree(proc.pid)
        raise
    finally:
        kill_group(proc.pid)  # ranks a launcher left behind
    return LaunchResult(list(command), proc.returncode, out, err, time.monotonic() - start, timed_out)


def _descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, whatever its session (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL `pid`'s process group and every descendant, with the groups they lead."""
    victims = _descendants(pid)  # before any kill: orphans are re-parented and lost from view
    kill_group(pid)
    own_group = os.getpgrp()
    for victim in victims:
        try:
            group = os.getpgid(victim)
            if group != own_group:
                os.killpg(group, signal.SIGKILL)
            os.kill(victim, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_group(pgid: int) -> None:
    """SIGKILL every process in group `pgid`; quiet when it is already gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
