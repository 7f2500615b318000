"""Workers lost and added mid-run, under horovodrun's elastic mode and torchrun's elastic agents, with
the sample accounting checked: outside the steps rolled back (at most one commit interval per
recovery), every sample of each epoch is trained exactly once.

Both run on this host: horovodrun's "hosts" are two names of it (discovery script), torchrun's are
two agents meeting at one c10d rendezvous.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, requires_horovod
from elastic_accounting import EPOCHS, WORKER, check_accounting

from paraflow.environment.launchers import free_port
from paraflow.environment.mpi_library import find_tool


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the job ended before {path.name}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout} s"
        time.sleep(0.05)


def start(cmd: list, env: dict, log_dir: Path) -> subprocess.Popen:
    out = open(log_dir / f"launcher-{len(list(log_dir.glob('launcher-*')))}.txt", "w")
    return subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def output(log_dir: Path) -> str:
    return "".join(p.read_text() for p in sorted(log_dir.glob("launcher-*.txt")))


def finish(procs: list, log_dir: Path, timeout: float = 150) -> None:
    try:
        for proc in procs:
            proc.wait(timeout=timeout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert all(p.returncode == 0 for p in procs), output(log_dir)[-6000:]


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process under it (a host that goes away)."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def horovodrun(log_dir: Path, hosts: Path, np: int) -> list:
    discover = log_dir / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    tool = find_tool("horovodrun") or "horovodrun"
    # --network-interface: else horovodrun waits for two hosts to find the interfaces they share
    sizes = ["-np", str(np), "--min-np", "1", "--max-np", "2", "--network-interface", "lo"]
    sizes += ["--host-discovery-script", str(discover)]
    return [tool, *sizes, sys.executable, str(WORKER), str(log_dir), str(EPOCHS)]


BOTH = "localhost:1\n127.0.0.1:1\n"


@requires_horovod
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("hosts_before", "hosts_after", "lost", "world", "said"),
    [
        pytest.param(BOTH, "localhost:1\n", True, 1, "going on with 1 processes (were 2)", id="lost-2-to-1"),
        pytest.param(
            "localhost:1\n",
            BOTH,
            False,
            2,
            "hosts were added or removed; going on with 2 processes (were 1)",
            id="added-1-to-2",
        ),
    ],
)
def test_horovod_a_host_lost_or_added_mid_epoch(no_leftovers, tmp_path, hosts_before, hosts_after, lost, world, said):
    hosts = tmp_path / "hosts"
    hosts.write_text(hosts_before)
    np = hosts_before.count("\n")
    proc = start(horovodrun(tmp_path, hosts, np), {**no_leftovers, "PARAFLOW_BACKEND": "horovod"}, tmp_path)
    wait_for(tmp_path / "epoch-1", proc)
    hosts.write_text(hosts_after)
    if lost:  # the host's worker dies with it
        workers = psutil.Process(proc.pid).children(recursive=True)
        next(p for p in workers if p.environ().get("HOROVOD_RANK") == "1" and str(WORKER) in p.cmdline()).kill()
    finish([proc], tmp_path)
    done = json.loads((tmp_path / "done.json").read_text())
    assert done["world_size"] == world and done["recoveries"] == int(lost) and done["resets"] == [world], done
    assert said in output(tmp_path)
    check_accounting(tmp_path, recoveries=int(lost))


def torchrun_agent(log_dir: Path, endpoint: str, hosts_the_store: bool, *worker_args: str) -> list:
    """One agent (a "host") of one process; the first serves the rendezvous' store (the host that stays)."""
    elastic = ["--nnodes", "1:2", "--nproc_per_node", "1", "--max-restarts", "3", "--rdzv-backend", "c10d"]
    conf = f"last_call_timeout=1,is_host={int(hosts_the_store)}"
    rendezvous = ["--rdzv-endpoint", endpoint, "--rdzv-id", "accounting", "--rdzv-conf", conf]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *elastic,
        *rendezvous,
        str(WORKER),
        str(log_dir),
        str(EPOCHS),
        *worker_args,
    ]


@pytest.mark.timeout(300)
def test_ddp_gloo_a_host_lost_the_other_restarts_from_the_commit(no_leftovers, tmp_path):
    endpoint = f"127.0.0.1:{free_port('127.0.0.1')}"
    env = {**no_leftovers, "PARAFLOW_BACKEND": "ddp-gloo", "PARAFLOW_ELASTIC_CHECKPOINT": str(tmp_path / "state.pt")}
    first = start(torchrun_agent(tmp_path, endpoint, True), env, tmp_path)
    second = start(torchrun_agent(tmp_path, endpoint, False), env, tmp_path)
    try:
        wait_for(tmp_path / "epoch-1", first)
    finally:
        kill_tree(second.pid)  # the second host goes away
        second.wait()
    finish([first], tmp_path)
    done = json.loads((tmp_path / "done.json").read_text())
    assert done["recoveries"] == 1 and done["world_size"] == 1, done
    assert "restart 1: restored epoch=1" in output(tmp_path) and "going on with 1 processes" in output(tmp_path)
    check_accounting(tmp_path, recoveries=1)


@pytest.mark.timeout(300)
def test_ddp_gloo_a_host_joins_and_the_job_goes_on_at_two(no_leftovers, tmp_path):
    endpoint = f"127.0.0.1:{free_port('127.0.0.1')}"
    env = {**no_leftovers, "PARAFLOW_BACKEND": "ddp-gloo", "PARAFLOW_ELASTIC_CHECKPOINT": str(tmp_path / "state.pt")}
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # else the agent that joins never gets the new round's store
    pause = "0.2"  # a step's pause: the epochs last longer than the second agent takes to start
    first = start(torchrun_agent(tmp_path, endpoint, True, pause), env, tmp_path)
    wait_for(tmp_path / "epoch-1", first)
    second = start(torchrun_agent(tmp_path, endpoint, False, pause), env, tmp_path)
    finish([first, second], tmp_path)
    done = json.loads((tmp_path / "done.json").read_text())
    assert done["recoveries"] == 1 and done["world_size"] == 2, done
    assert "restart 1: restored epoch=" in output(tmp_path) and "going on with 2 processes" in output(tmp_path)
    check_accounting(tmp_path, recoveries=1)
