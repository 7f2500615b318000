"""A stopped rank ends the job within paraflow's timeout plus 10 s under `paraflow run` with
each launcher it starts on one host (mpirun, torchrun, horovodrun) and under `paraflow.launch`.

Rank 1 SIGSTOPs itself (paraflow timeout 10 s); nothing here wakes or kills it: the launcher,
`paraflow run` or `paraflow.launch` must end the whole job, the stopped process included, in
time. torchrun's agent and horovodrun would wait out their own grace before their SIGKILL;
`paraflow run` kills a stopped process as soon as its launcher has sent it SIGTERM.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, requires_horovod
from faultkit import FAULT_WORKERS, STARTUP_S, TIMEOUT_S, fault_env, process_state

from paraflow.tools.launch import kill_group

#: How soon after the stop the job must have ended, every process of it included.
ENDS_WITHIN_S = TIMEOUT_S + 10


def run_and_time_the_end(command: list, directory: Path, env: dict):
    """Start `command`; return (stdout, stderr, exit status, seconds from rank 1's stop to the job's end, its pid)."""
    out, err = directory / "stdout", directory / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(command, cwd=str(ROOT), env=env, stdout=stdout, stderr=stderr, start_new_session=True)
    stopped_at, stopped_pid = None, None
    try:
        deadline = time.monotonic() + STARTUP_S + 120
        while proc.poll() is None and time.monotonic() < deadline:
            pid_file = directory / "rank1.pid"
            if stopped_at is None and pid_file.exists() and pid_file.read_text().strip():
                stopped_pid = int(pid_file.read_text())
                if process_state(stopped_pid) == "T":
                    stopped_at = time.monotonic()
            time.sleep(0.05)
        assert proc.poll() is not None, f"the job was still running after {STARTUP_S + 120} s"
        ended = time.monotonic()
    finally:
        kill_group(proc.pid)
        if stopped_pid and process_state(stopped_pid):
            os.kill(stopped_pid, signal.SIGKILL)
    assert stopped_at is not None, f"rank 1 never stopped:\n{out.read_text()}\n{err.read_text()[-3000:]}"
    return out.read_text(), err.read_text(), proc.returncode, ended - stopped_at, stopped_pid


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "backend, launcher, phase",
    [
        pytest.param("horovod", "mpirun", "wrap_model", id="horovod-mpirun", marks=requires_horovod),
        pytest.param("ddp-gloo", "torchrun", "wrap_model", id="ddp-gloo-torchrun"),
        pytest.param("horovod", "horovodrun", "wrap_model", id="horovod-horovodrun", marks=requires_horovod),
    ],
)
def test_paraflow_run_ends_a_job_with_a_stopped_rank_within_the_timeout_plus_10_s(
    no_leftovers, tmp_path, backend, launcher, phase
):
    command = [sys.executable, "-m", "paraflow.cli", "run", "-n", "2", "--backend", backend, "--launcher", launcher]
    command += [str(FAULT_WORKERS / "phases.py"), backend, phase, str(tmp_path)]
    stdout, stderr, status, took, stopped_pid = run_and_time_the_end(command, tmp_path, {**no_leftovers, **fault_env()})
    assert status != 0
    assert took <= ENDS_WITHIN_S, f"the job ended {took:.1f} s after the stop:\n{stderr[-3000:]}"
    assert not process_state(stopped_pid), "the stopped rank outlived the job"
    assert "rank 1" in stdout + stderr, "nothing named the stopped rank"


LAUNCH_A_STOPPING_RANK = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import paraflow

    def work(backend, directory):
        Path(directory, f"rank{backend.rank}.pid").write_text(str(os.getpid()))
        if backend.rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        backend.barrier()

    if __name__ == "__main__":
        try:
            paraflow.launch(work, sys.argv[1], nprocs=2, backend="ddp-gloo")
        except paraflow.ParaflowError as exc:
            print(type(exc).__name__, exc)
            sys.exit(1)
    """
)


@pytest.mark.timeout(300)
def test_paraflow_launch_ends_a_call_with_a_stopped_rank_within_the_timeout_plus_10_s(no_leftovers, tmp_path):
    script = tmp_path / "stopping.py"
    script.write_text(LAUNCH_A_STOPPING_RANK)
    command = [sys.executable, str(script), str(tmp_path)]
    stdout, stderr, status, took, stopped_pid = run_and_time_the_end(command, tmp_path, {**no_leftovers, **fault_env()})
    assert status == 1, stdout + stderr[-3000:]
    assert took <= ENDS_WITHIN_S, f"paraflow.launch returned {took:.1f} s after the stop:\n{stderr[-3000:]}"
    assert not process_state(stopped_pid), "the stopped rank outlived the call"
    assert "rank 1" in stdout, stdout
