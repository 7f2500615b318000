"""Build and run launcher command lines: torchrun, mpirun, horovodrun, srun, plain python.

Used by ``paraflow run``, the benchmarks and the tests; a run that ends, times out or is
interrupted takes its whole process group down with it, so a hung rank never outlives its launch,
and a stopped rank that its launcher has asked to end is killed at once, not after the
launcher's grace (:func:`end_stopped`).

:func:`host_commands` builds the commands that start one job across several hosts, for each
launcher, as its documentation says:

* torchrun: one agent per host, all meeting at a c10d rendezvous on the first host;
* mpirun: one command on the first host; Open MPI starts the other hosts' daemons through its rsh
  agent (ssh by default);
* horovodrun: one command on the first host; horovodrun reaches the others with `ssh`.

mpirun's and horovodrun's lines are :func:`launch_command`'s for those hosts, with what crossing
hosts needs added: the interface the ranks talk over, the program that reaches another host, and
Open MPI's keepalive probes. (``paraflow run --hosts`` starts torchrun with its static rendezvous
and a node rank per host instead.) Nothing here knows how a host is reached: a real cluster runs
each :class:`HostCommand` over ssh, the emulated one (:mod:`paraflow.tools.cluster`) inside the
host's namespace.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from ..environment.launchers import HostCommand, launcher_for_tool, launcher_tools
from ..environment.launchers.openmpi import OOB_KEEPALIVE, mpirun_prefix
from ..environment.mpi_library import find_tool
from ..errors import ConfigurationError

__all__ = [
    "find_tool",
    "start_group",
    "launch_command",
    "run_launch",
    "LaunchResult",
    "kill_tree",
    "kill_descendants",
    "end_stopped",
    "mpirun_prefix",
    "HostCommand",
    "host_commands",
    "MULTIHOST_LAUNCHERS",
    "OOB_KEEPALIVE",
]

#: How often a running launch looks for stopped processes its launcher has asked to end (seconds).
WATCH_INTERVAL_S = 0.5


def launch_command(
    launcher: str,
    nproc: int,
    script: Sequence[str],
    port: Optional[int] = None,
    env_keys: Sequence[str] = (),
    hosts: Optional[Sequence[tuple[str, int]]] = None,
    node_rank: int = 0,
    must_exist: bool = True,
) -> list[str]:
    """The command that starts `script` (a Python file and its arguments) as `nproc` processes.

    Args:
        launcher: the program: python, torchrun, mpirun, horovodrun or srun (each launcher's
            module builds its own command: paraflow.environment.launchers).
        nproc: number of processes (python takes 1 only).
        script: the Python file followed by its arguments.
        port: rendezvous port for torchrun (default: a free one; 29500 with `hosts`).
        env_keys: variables mpirun must forward to its ranks.
        hosts: (host, processes) pairs of a multi-host job, rank 0's host first (None: this host).
            torchrun runs one agent per host: the command is the one for host `node_rank`.
        node_rank: which host's torchrun command to build.
        must_exist: False names a launcher missing here by its bare name (a command to print).
    """
    return launcher_for_tool(launcher).launch_command(
        sys.executable,
        nproc,
        list(script),
        port=port,
        env_keys=env_keys,
        hosts=hosts,
        node_rank=node_rank,
        must_exist=must_exist,
    )


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


def start_group(command: Sequence[str], env: Optional[Mapping[str, Optional[str]]], cwd: Optional[str], **streams):
    """Start `command` as the leader of a new process group (so that kill_tree ends all it starts).

    `env` is added to this process's environment; a key whose value is None is removed.
    """
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    return subprocess.Popen(list(command), text=True, env=full_env, cwd=cwd, start_new_session=True, **streams)


def run_launch(
    command: Sequence[str],
    timeout: Optional[float],
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    capture: bool = True,
) -> LaunchResult:
    """Run `command` in its own process group; on timeout kill it and every process it started.

    `env` is added to this process's environment; a key whose value is None is removed.
    `capture=False` lets the output through to this process's own (stdout and stderr of the
    result are then empty); `timeout=None` waits for as long as the command runs. Meanwhile a
    process of the launch that is stopped and has been sent SIGTERM is killed at once
    (:func:`end_stopped`).
    """
    start = time.monotonic()
    pipe = subprocess.PIPE if capture else None
    proc = start_group(command, env, cwd, stdout=pipe, stderr=pipe)
    timed_out = False
    try:
        out, err = _communicate_watching(proc, None if timeout is None else start + timeout)
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
    return LaunchResult(list(command), proc.returncode, out or "", err or "", time.monotonic() - start, timed_out)


def _communicate_watching(proc: subprocess.Popen, deadline: Optional[float]) -> tuple:
    """``proc.communicate()`` until the monotonic `deadline` (None: none), ending stopped processes on the way.

    Raises:
        subprocess.TimeoutExpired: `proc` still runs at `deadline`.
    """
    while True:
        step = WATCH_INTERVAL_S if deadline is None else max(0.0, min(WATCH_INTERVAL_S, deadline - time.monotonic()))
        try:
            return proc.communicate(timeout=step)
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            end_stopped(proc.pid)


def prctl(option: int, arg: int) -> bool:
    """Call Linux's prctl(`option`, `arg`); False where it cannot be called (another system, no libc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        return False
    return True


def _process_table() -> dict[int, tuple[int, str]]:
    """Every process's (parent pid, state letter), from /proc (Linux; empty elsewhere)."""
    table = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return table
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError, IndexError):
            continue
        table[int(entry)] = (int(ppid), state)
    return table


def _descendants(pid: int, table: Optional[dict] = None) -> list[int]:
    """Every live descendant of `pid`, whatever its session (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for child, (ppid, _) in (_process_table() if table is None else table).items():
        children.setdefault(ppid, []).append(child)
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _pending(pid: int) -> int:
    """The signals waiting for process `pid` (its main thread's and the whole process's); 0 if unknown."""
    mask = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("SigPnd:", "ShdPnd:")):
                    mask |= int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return 0
    return mask


def end_stopped(pid: int) -> list[int]:
    """SIGKILL every descendant of `pid` that is stopped with a SIGTERM waiting; return their pids.

    When a rank fails, the launcher ends the others with SIGTERM and, after a grace of its own,
    SIGKILL (torchrun's agent 30 s; horovodrun 5 s for the rank, then 5 s more for the shell
    around it). A stopped process (SIGSTOP, a debugger) cannot act on SIGTERM until it is continued,
    so it would hold the job for that whole grace; this gives it the SIGKILL at once. Processes
    that are not stopped, or that no one asked to end, are left alone.
    """
    table = _process_table()
    stopped = [
        child
        for child in _descendants(pid, table)
        if table[child][1] in "Tt" and _pending(child) & (1 << (signal.SIGTERM - 1))
    ]
    for victim in stopped:  # the process alone: its group may hold its launcher
        try:
            os.kill(victim, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return stopped


def kill_tree(pid: int) -> None:
    """SIGKILL `pid`'s process group and every descendant, with the groups they lead."""
    victims = _descendants(pid)  # before any kill: orphans are re-parented and lost from view
    kill_group(pid)
    _kill(victims)


def kill_descendants(pid: int) -> None:
    """SIGKILL every live descendant of `pid` (not `pid` itself), with the groups they lead."""
    _kill(_descendants(pid))


def _kill(victims: list[int]) -> None:
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


MULTIHOST_LAUNCHERS = launcher_tools(multihost=True)


def host_commands(
    launcher: str,
    hosts: Sequence[str],
    nproc_per_host: int,
    script: Sequence[str],
    *,
    port: int = 29400,
    ifname: Optional[str] = None,
    env_keys: Sequence[str] = (),
    rsh_agent: Optional[str] = None,
    job_id: Optional[str] = None,
) -> list[HostCommand]:
    """The per-host commands that start `script` as ``len(hosts) * nproc_per_host`` processes.

    Args:
        launcher: torchrun, mpirun or horovodrun.
        hosts: host names (or addresses) the launchers can resolve; the first hosts the rendezvous.
        nproc_per_host: processes on each host.
        script: the Python file and its arguments.
        port: torchrun's rendezvous port on the first host.
        ifname: the network interface ranks talk over (eth0): GLOO_SOCKET_IFNAME, Open MPI's
            btl/oob_tcp_if_include, horovodrun's --network-interface. None lets each library choose.
        env_keys: variables of the launching environment every rank needs (mpirun forwards them
            with -x; horovodrun forwards the whole environment; torchrun runs where they are set).
        rsh_agent: the program that runs a command on another host in place of ssh (mpirun's
            plm_rsh_agent; for horovodrun its directory goes first on PATH, so it must be named ssh).
        job_id: torchrun's rendezvous id (default: a fresh one).
    """
    if launcher not in MULTIHOST_LAUNCHERS:
        raise ConfigurationError(f"unknown launcher {launcher!r}; across hosts: {', '.join(MULTIHOST_LAUNCHERS)}.")
    if not hosts or nproc_per_host < 1:
        raise ConfigurationError(
            f"need at least one host and one process per host (got {list(hosts)}, {nproc_per_host})."
        )
    return launcher_for_tool(launcher).host_commands(
        sys.executable,
        list(hosts),
        nproc_per_host,
        [str(s) for s in script],
        port=port,
        ifname=ifname,
        env_keys=env_keys,
        rsh_agent=rsh_agent,
        job_id=job_id,
    )
