"""Run commands on the emulated hosts: one command (`paraflow cluster exec`) or a whole job.

A command on a host runs inside its namespace under its host name (a UTS namespace of its own,
through ``unshare --uts``), with the caller's environment and working directory: like a shell
on that host. A job is the :class:`~paraflow.tools.launch.HostCommand` list for a launcher,
started together, waited for with one deadline, and on timeout killed with every process left
in the cluster's namespaces.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Optional

from ..launch import HostCommand, LaunchResult, host_commands, kill_tree, start_group
from . import netns
from .cluster import IFNAME, Cluster

__all__ = ["exec_argv", "cluster_commands", "ClusterJob"]


def exec_argv(cluster: Cluster, host: str, argv: Sequence[str]) -> list[str]:
    """The command line that runs `argv` on `host` of `cluster`."""
    h = cluster.host(host)
    return ["ip", "netns", "exec", h.namespace, "unshare", "--uts"] + [
        "sh",
        "-c",
        'hostname "$0" && exec "$@"',
        h.name,
        *map(str, argv),
    ]


def cluster_commands(
    cluster: Cluster,
    launcher: str,
    script: Sequence[str],
    nproc_per_host: int = 1,
    hosts: Optional[int] = None,
    env_keys: Sequence[str] = (),
    port: int = 29400,
) -> list[HostCommand]:
    """:func:`~paraflow.tools.launch.host_commands` for the first `hosts` hosts of `cluster`
    (default all), over its interface and through its ssh stand-in."""
    names = [h.name for h in cluster.hosts[: hosts or len(cluster.hosts)]]
    return host_commands(
        launcher,
        names,
        nproc_per_host,
        script,
        port=port,
        ifname=IFNAME,
        env_keys=env_keys,
        rsh_agent=cluster.ssh_agent,
    )


class ClusterJob:
    """The commands of one job, each started on its host; output kept in temporary files.

    Args:
        cluster: the cluster to run on.
        commands: what to run where (see :func:`cluster_commands`).
        env: variables added to every command's environment (a value of None removes one).
        cwd: working directory on every host (one file system: the same path everywhere).
    """

    def __init__(
        self,
        cluster: Cluster,
        commands: Sequence[HostCommand],
        env: Optional[Mapping[str, Optional[str]]] = None,
        cwd: Optional[str] = None,
    ) -> None:
        self.cluster = cluster
        self.commands = list(commands)
        self.started = time.monotonic()
        self._procs: list[tuple[subprocess.Popen, object, object]] = []
        for command in self.commands:
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            argv = exec_argv(cluster, command.host, command.argv)
            proc = start_group(argv, {**(env or {}), **command.env}, cwd, stdout=out, stderr=err)
            self._procs.append((proc, out, err))

    def poll(self) -> bool:
        """True once every command has exited."""
        return all(proc.poll() is not None for proc, _, _ in self._procs)

    def wait(self, timeout: float) -> list[LaunchResult]:
        """Wait for every command (at most `timeout` s from the start); kill everything on expiry.

        Returns:
            One result per command, in order; ``timed_out`` on all of them if the deadline passed.
        """
        deadline = self.started + timeout
        timed_out = False
        for proc, _, _ in self._procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            self.kill()
        results, elapsed = [], time.monotonic() - self.started
        for command, (proc, out, err) in zip(self.commands, self._procs):
            proc.wait()
            texts = []
            for f in (out, err):
                f.seek(0)
                texts.append(f.read())
                f.close()
            argv = exec_argv(self.cluster, command.host, command.argv)
            results.append(LaunchResult(argv, proc.returncode, texts[0], texts[1], elapsed, timed_out))
        return results

    def kill(self) -> None:
        """SIGKILL every command with what it started, and every process left in the cluster."""
        for proc, _, _ in self._procs:
            kill_tree(proc.pid)
        for ns in self.cluster.processes():
            netns.kill_namespace_processes(ns)
