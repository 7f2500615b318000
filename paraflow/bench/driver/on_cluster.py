"""The benchmark on an emulated cluster: one rank per host, gradients crossing shaped links.

`paraflow bench --cluster N --bandwidth RATE` builds N hosts (network namespaces joined by a
switch, see :mod:`paraflow.tools.cluster`), runs every multi-process cell with one process on
each host under its launcher's multi-host command line, and the one-process cells on the first
host. The hosts share this machine's cores, so the threads per process are those of N processes
on one host: against a one-host run only the transport changes (a link of RATE instead of
shared memory and loopback).
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import Iterator
from typing import Optional

from ...tools.launch import LaunchResult
from .config import BenchConfig
from .matrix import Cell
from .scratch import launch_scratch

__all__ = ["bench_cluster", "run_on_cluster", "cluster_header"]

_FAMILY = "b"  # benchmark clusters are named b<pid>: a killed run's is removed by the next one


@contextlib.contextmanager
def bench_cluster(config: BenchConfig) -> Iterator[Optional[object]]:
    """The cluster the run uses (None without --cluster), taken down afterwards whatever happens."""
    if not config.cluster:
        yield None
        return
    from ...tools.cluster import Cluster, owned_name, remove_stale

    remove_stale(_FAMILY)
    cluster = Cluster(owned_name(_FAMILY), config.cluster, config.bandwidth).up()
    try:
        yield cluster
    finally:
        cluster.down()


def cluster_header(cluster) -> dict:
    """What the results header records about the link."""
    from ...tools.cluster import IFNAME

    return {
        "hosts": len(cluster.hosts),
        "bandwidth": cluster.bandwidth or "unshaped",
        "interface": IFNAME,
        "link": "veth pair to a bridge, tbf both ways" if cluster.bandwidth else "veth pair to a bridge",
        "ranks_per_host": 1,
    }


def run_on_cluster(cluster, cell: Cell, script: list, env: dict, timeout: float) -> tuple[list, LaunchResult]:
    """Launch `cell` on `cluster`: the per-host commands (as shell lines) and one merged result.

    The result fails when any host's command does; its output is every host's, labelled.
    """
    from ...tools.cluster import ClusterJob, cluster_commands
    from ...tools.launch import HostCommand

    if cell.nproc == 1:
        commands = [HostCommand(cluster.hosts[0].name, [sys.executable, *script])]
    else:
        keys = [k for k, v in env.items() if v is not None and not k.startswith("OMPI_MCA_")]
        commands = cluster_commands(cluster, cell.launcher, script, hosts=cell.nproc, env_keys=keys)
    with launch_scratch() as scratch:  # the hosts share this machine's files; gone after the launch
        results = ClusterJob(cluster, commands, env={**env, **scratch}).wait(timeout)
    lines = [
        ["env", *(f"{k}={v}" for k, v in c.env.items()), "paraflow", "cluster", "exec", "--name", cluster.name]
        + [c.host, "--", *map(str, c.argv)]
        for c in commands
    ]
    failed = [r.returncode for r in results if r.returncode != 0]
    merged = LaunchResult(
        [shlex.join(line) for line in lines],
        failed[0] if failed else 0,
        "".join(f"[{c.host}] {r.stdout}" for c, r in zip(commands, results)),
        "".join(f"[{c.host}] {r.stderr}" for c, r in zip(commands, results)),
        max(r.elapsed_s for r in results),
        any(r.timed_out for r in results),
    )
    return lines, merged
