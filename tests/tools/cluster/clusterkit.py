"""Test helpers for the emulated cluster: a fixture that builds one and checks it is left clean.

Test modules import the fixture (``from clusterkit import cluster_fixture``); each module gets its own
two-host cluster, named after this process (``t<pid>...``) so that a run killed half-way is
cleaned up by the next one (``remove_stale``), and torn down after the module's last test even
when a test failed. Teardown fails the module if any process was still running on the hosts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RANK_ENV, ROOT

from paraflow.environment.launchers import free_port
from paraflow.tools.cluster import (
    Cluster,
    ClusterJob,
    cluster_commands,
    exec_argv,
    owned_name,
    remove_stale,
    support_problem,
)

CLUSTER_WORKERS = Path(__file__).resolve().parent / "workers"
FAMILY = "t"  # every cluster these tests build is named t<pid><tag>
#: paraflow's timeout inside the cluster tests: short, so failures end quickly.
TIMEOUT_S = 10


def skip_without_namespaces() -> None:
    """Skip the calling test (or fixture) with the reason when this machine cannot build a cluster."""
    problem = support_problem()
    if problem:
        pytest.skip(f"no emulated cluster on this machine: {problem}")


def build(tag: str = "", hosts: int = 2, **options) -> Cluster:
    """A new cluster named after this process; stale ones of dead test processes are removed first."""
    skip_without_namespaces()
    remove_stale(FAMILY)
    return Cluster(owned_name(FAMILY, tag=tag), hosts, **options).up()


@pytest.fixture(scope="module", name="cluster")
def cluster_fixture():
    """Two hosts, unshaped, for one test module; down afterwards, and no process may be left on it."""
    built = build()
    try:
        yield built
        left = built.processes()
    finally:
        built.down()
    assert not left, f"processes were still running in the cluster's namespaces: {left}"
    assert not built.exists()


def job_env(**extra: str) -> dict:
    """What every rank in the cluster tests runs with: one thread, this checkout, the short timeout."""
    return {**RANK_ENV, "PARAFLOW_TIMEOUT": str(TIMEOUT_S), **extra}


def start_job(cluster: Cluster, launcher: str, script: list, nproc_per_host: int = 1, env: dict | None = None):
    """Start `script` (a path and its arguments) under `launcher` on every host of `cluster`."""
    variables = job_env(**(env or {}))
    commands = cluster_commands(
        cluster, launcher, [str(s) for s in script], nproc_per_host, env_keys=list(variables), port=free_port()
    )
    return ClusterJob(cluster, commands, env=variables, cwd=str(ROOT))


def run_job(cluster: Cluster, launcher: str, script: list, timeout: float = 180, **kwargs) -> list:
    """Run a job to the end; every command must exit 0 in time. Returns the per-host results."""
    job = start_job(cluster, launcher, script, **kwargs)
    results = job.wait(timeout)
    for result in results:
        assert not result.timed_out, f"timed out after {timeout} s: {' '.join(result.command)}\n{result.stderr[-3000:]}"
        assert result.returncode == 0, (
            f"exit {result.returncode}: {' '.join(result.command)}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
        )
    return results


def on_host(cluster: Cluster, host: str, *argv: str) -> list:
    """The command line running `argv` on `host` (for subprocess)."""
    return exec_argv(cluster, host, list(argv))
