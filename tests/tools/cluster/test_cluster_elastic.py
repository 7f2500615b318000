"""Elastic training across emulated hosts: the second host is lost mid-run (2 hosts -> 1) and the job
goes on, and a host is added (1 -> 2) and joins; every sample of each epoch is trained once outside
the steps rolled back (tests/elastic/elastic_accounting.py).

horovodrun: its elastic mode on the first host, which reaches the second through the cluster's
ssh stand-in, the hosts listed by a discovery script the test edits.
torchrun: one elastic agent per host at a c10d rendezvous served by the first host, commits in a
checkpoint both hosts read (one file system). A host is lost by killing every process in its
namespace; a host joins by starting its agent mid-run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from clusterkit import cluster_fixture, job_env  # noqa: F401
from conftest import ROOT, requires_horovod

from paraflow.environment.launchers import HostCommand, free_port
from paraflow.tools.cluster import IFNAME, ClusterJob, kill_namespace_processes

sys.path.insert(0, str(ROOT / "tests" / "elastic"))
from elastic_accounting import EPOCHS, WORKER, check_accounting  # noqa: E402

pytestmark = pytest.mark.cluster


def wait_for(path: Path, job: ClusterJob, timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert not job.poll(), f"the job ended before {path.name}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout} s"
        time.sleep(0.1)


def torchrun_agents(cluster, log_dir: Path, *worker_args: str) -> list:
    """One elastic agent of one process per host, at a c10d rendezvous the first host serves."""
    endpoint = f"{cluster.hosts[0].address}:{free_port()}"
    commands = []
    for i, host in enumerate(cluster.hosts):
        agent = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc_per_node", "1"]
        agent += ["--max-restarts", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "acct"]
        agent += ["--rdzv-conf", f"last_call_timeout=1,is_host={int(i == 0)}"]
        agent += [str(WORKER), str(log_dir), str(EPOCHS), *worker_args]
        commands.append(HostCommand(host.name, agent, {"GLOO_SOCKET_IFNAME": IFNAME}))
    return commands


def torchrun_env(log_dir: Path) -> dict:
    """ddp-gloo, commits in `log_dir`, and the agents' setting that lets a host join (docs/elastic.md)."""
    env = job_env(PARAFLOW_BACKEND="ddp-gloo", PARAFLOW_ELASTIC_CHECKPOINT=str(log_dir / "state.pt"))
    return {**env, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@pytest.mark.timeout(300)
def test_ddp_gloo_torchrun_a_host_lost_the_other_restarts_from_the_commit(cluster, tmp_path):
    job = ClusterJob(cluster, torchrun_agents(cluster, tmp_path), env=torchrun_env(tmp_path), cwd=str(ROOT))
    try:
        wait_for(tmp_path / "epoch-1", job)
        kill_namespace_processes(cluster.hosts[1].namespace)  # the second host goes away
        first, second = job.wait(200)
    finally:
        job.kill()
    assert not first.timed_out and first.returncode == 0, first.stdout[-3000:] + first.stderr[-5000:]
    done = json.loads((tmp_path / "done.json").read_text())
    assert done["recoveries"] == 1 and done["world_size"] == 1, done
    assert "going on with 1 processes" in first.stderr
    check_accounting(tmp_path, recoveries=1)


@pytest.mark.timeout(300)
def test_ddp_gloo_torchrun_a_host_joins_and_the_job_goes_on_at_two(cluster, tmp_path):
    first, second = torchrun_agents(cluster, tmp_path, "0.2")  # a step's pause: epochs outlast an agent's start
    env = torchrun_env(tmp_path)
    job = ClusterJob(cluster, [first], env=env, cwd=str(ROOT))
    joined = None
    try:
        wait_for(tmp_path / "epoch-1", job)
        joined = ClusterJob(cluster, [second], env=env, cwd=str(ROOT))  # the second host comes
        results = job.wait(200) + joined.wait(200)
    finally:
        for started in (job, joined):
            if started is not None:
                started.kill()
    for result in results:
        assert not result.timed_out and result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    done = json.loads((tmp_path / "done.json").read_text())
    assert done["recoveries"] == 1 and done["world_size"] == 2, done
    assert "going on with 2 processes" in results[0].stderr + results[1].stderr
    check_accounting(tmp_path, recoveries=1)


@requires_horovod
@pytest.mark.timeout(300)
@pytest.mark.parametrize("lost", [True, False], ids=["lost-2-to-1", "added-1-to-2"])
def test_horovod_horovodrun_a_host_lost_or_added(cluster, tmp_path, lost):
    from paraflow.environment.mpi_library import find_tool

    # A job whose hosts are all the launching one takes loopback for good (horovod picks the
    # interfaces once, at the start), so the one-host job runs on the other host.
    both = "".join(f"{host.address}:1\n" for host in cluster.hosts)
    first = f"{cluster.hosts[0 if lost else 1].address}:1\n"
    hosts = tmp_path / "hosts"
    hosts.write_text(both if lost else first)
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    run = [find_tool("horovodrun") or "horovodrun", "-np", "2" if lost else "1", "--min-np", "1", "--max-np", "2"]
    run += ["--network-interface", IFNAME, "--host-discovery-script", str(discover)]
    run += [sys.executable, str(WORKER), str(tmp_path), str(EPOCHS)]
    path = str(Path(cluster.ssh_agent).parent) + ":" + os.environ.get("PATH", "")
    env = job_env(PARAFLOW_BACKEND="horovod", PATH=path)
    command = HostCommand(cluster.hosts[0].name, run, {"GLOO_SOCKET_IFNAME": IFNAME})
    job = ClusterJob(cluster, [command], env=env, cwd=str(ROOT))
    try:
        try:
            wait_for(tmp_path / "epoch-1", job)
        except AssertionError:
            (result,) = job.wait(10)
            raise AssertionError(result.stdout[-3000:] + result.stderr[-5000:]) from None
        hosts.write_text(first if lost else both)
        if lost:
            kill_namespace_processes(cluster.hosts[1].namespace)  # the second host goes away
        (result,) = job.wait(200)
    finally:
        job.kill()
    text = result.stdout + result.stderr
    assert not result.timed_out and result.returncode == 0, text[-6000:]
    done = json.loads((tmp_path / "done.json").read_text())
    assert done["recoveries"] == int(lost) and done["world_size"] == (1 if lost else 2), done
    assert ("going on with 1 processes (were 2)" if lost else "going on with 2 processes (were 1)") in text
    check_accounting(tmp_path, recoveries=int(lost))
