"""train.py under a real Slurm (slurmctld, one slurmd per emulated host): srun, sbatch, paraflow run, a killed
task, a stopped task.

Each job trains on digits for a few steps and exports its parameters, which must be `single`'s
(tests/trainkit.py). Slurm's daemons and the cluster are started once for the module (slurmkit)
and checked gone afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
from clusterkit import CLUSTER_WORKERS
from conftest import requires_horovod
from reliability.faultkit import FAULT_WORKERS, TIMEOUT_S, fault_env, process_state
from slurmkit import command_line, slurm_fixture  # noqa: F401
from trainkit import assert_same_parameters, exported_parameters, single_reference, train_args

# Generous: the module's first test also installs Slurm when missing and starts its daemons.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
#: How soon after a task is killed every process of the job must be gone.
EXIT_BOUND_S = 60


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return single_reference(tmp_path_factory.mktemp("single"))


def srun(*layout: str) -> list:
    return ["srun", *layout, sys.executable]


LAYOUTS = [
    pytest.param("ddp-gloo", ("-N2", "--ntasks-per-node=1"), id="ddp-gloo-2-nodes"),
    pytest.param("horovod", ("-N2", "--ntasks-per-node=1"), id="horovod-2-nodes", marks=requires_horovod),
    pytest.param("horovod", ("-N1", "-n2"), id="horovod-1-node-2-tasks", marks=requires_horovod),
]


@pytest.mark.parametrize("backend, layout", LAYOUTS)
def test_srun_matches_single(slurm, single, tmp_path, backend, layout):
    out = tmp_path / "params.pt"
    done = slurm.run([*srun(*layout), *train_args(backend, out)], timeout=240)
    assert "held-out accuracy" in done.stdout, done.stdout[-2000:]
    assert_same_parameters(exported_parameters(out), single)
    assert slurm.jobs() == ""


def test_sbatch_script_calling_srun_writes_its_output(slurm, single, tmp_path):
    out, log = tmp_path / "params.pt", tmp_path / "job.out"
    command = shlex.join(map(str, [*srun(), *train_args("ddp-gloo", out)]))
    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/sh\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --output={log}\n"
        f"echo job $SLURM_JOB_ID on $SLURM_JOB_NODELIST\n{command}\n"
    )
    done = slurm.run(["sbatch", "--wait", "--parsable", script], timeout=240)
    job_id = done.stdout.strip().split(";")[0]
    text = log.read_text()
    assert f"job {job_id} on node[0-1]" in text, text[-2000:]
    assert "held-out accuracy" in text, text[-2000:]
    assert_same_parameters(exported_parameters(out), single)


def test_paraflow_run_builds_the_srun_command(slurm, single, tmp_path):
    out = tmp_path / "params.pt"
    run = [sys.executable, "-m", "paraflow.cli", "run", "--launcher", "srun", "--hosts", "node0:1,node1:1"]
    script = [str(a) for a in train_args("ddp-gloo", out)]
    script.remove("--backend"), script.remove("ddp-gloo")  # paraflow run hands it over as PARAFLOW_BACKEND
    dry = slurm.run([*run, "--backend", "ddp-gloo", "--dry-run", *script], timeout=60)
    srun_path = slurm.run(["sh", "-c", "command -v srun"], timeout=20).stdout.strip()
    expected = [srun_path, "-n", "2", "--nodelist", "node0,node1", "--ntasks-per-node", "1", "--kill-on-bad-exit=1"]
    assert f"PARAFLOW_BACKEND=ddp-gloo {shlex.join([*expected, sys.executable, *script])}" in dry.stdout, dry.stdout
    done = slurm.run([*run, "--backend", "ddp-gloo", *script], timeout=240)
    assert "held-out accuracy" in done.stdout and "launcher srun" in done.stdout + done.stderr, done.stdout[-2000:]
    assert_same_parameters(exported_parameters(out), single)


@contextlib.contextmanager
def _killed_if_left(job: subprocess.Popen):
    """Kill the job (srun on the login node) if it still runs when the block ends."""
    try:
        yield job
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()


def _task_pids(slurm, host: str, needle: str) -> list:
    """Processes on `host` whose command line holds `needle` (the job's tasks)."""
    namespace = slurm.cluster.host(host).namespace
    return [pid for pid in slurm.cluster.processes().get(namespace, []) if needle in command_line(pid)]


def test_a_killed_task_ends_the_job_and_names_its_rank(slurm, tmp_path):
    worker = CLUSTER_WORKERS / "train_until_cut.py"
    job = slurm.start_on_login(
        [*srun("-N2", "--ntasks-per-node=1"), worker, "ddp-gloo", tmp_path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    with _killed_if_left(job):
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"rank{r}.started").exists() for r in (0, 1)):
            assert job.poll() is None, f"the job ended before training got going: {job.communicate()}"
            assert time.monotonic() < deadline, "training did not start within 120 s"
            time.sleep(0.2)
        (victim,) = _task_pids(slurm, "node1", str(worker))
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        stdout, stderr = job.communicate(timeout=EXIT_BOUND_S)
        ended_after = time.monotonic() - killed
    output = stdout + stderr
    assert ended_after < EXIT_BOUND_S
    assert job.returncode != 0, output[-3000:]
    # srun names the task that died; rank 0's own error names the rank it lost.
    assert "node1: task 1: Killed" in stderr, stderr[-3000:]
    rank0 = json.loads((tmp_path / "rank0.error").read_text())
    assert rank0["type"] == "CollectiveError" and "the connection to rank 1 was lost" in rank0["message"], rank0
    assert "the connection to rank 1 was lost" in stderr
    deadline = time.monotonic() + 30
    while (_task_pids(slurm, "node0", str(worker)) or slurm.jobs()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _task_pids(slurm, "node0", str(worker)) and not _task_pids(slurm, "node1", str(worker))
    assert slurm.jobs() == ""


def test_a_stopped_task_ends_paraflow_runs_srun_job_within_the_timeout_plus_10_s(slurm, tmp_path):
    """srun --kill-on-bad-exit=1 continues and terminates the stopped task once the other has failed."""
    run = [sys.executable, "-m", "paraflow.cli", "run", "--launcher", "srun", "--hosts", "node0:1,node1:1"]
    run += ["--backend", "ddp-gloo", FAULT_WORKERS / "phases.py", "ddp-gloo", "wrap_model", tmp_path]
    job = slurm.start_on_login(run, env=fault_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pid_file, stopped_at, stopped_pid = tmp_path / "rank1.pid", None, None
    try:
        with _killed_if_left(job):
            deadline = time.monotonic() + 180
            while stopped_at is None:
                assert job.poll() is None, f"the job ended before rank 1 stopped: {job.communicate()}"
                assert time.monotonic() < deadline, "rank 1 did not stop within 180 s"
                if pid_file.exists() and pid_file.read_text().strip():
                    stopped_pid = int(pid_file.read_text())
                    if process_state(stopped_pid) == "T":
                        stopped_at = time.monotonic()
                time.sleep(0.05)
            stdout, stderr = job.communicate(timeout=EXIT_BOUND_S)
            took = time.monotonic() - stopped_at
    finally:
        if stopped_pid and process_state(stopped_pid):
            os.kill(stopped_pid, signal.SIGKILL)
    assert job.returncode != 0
    assert took <= TIMEOUT_S + 10, f"the job ended {took:.1f} s after the stop:\n{stderr[-3000:]}"
    assert "rank 1" in stdout + stderr, stderr[-3000:]
    assert "node1: task 1: Terminated" in stderr, stderr[-3000:]  # SIGCONT and SIGTERM, no SIGKILL needed
    deadline = time.monotonic() + 30
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert slurm.jobs() == ""
