"""train.py --elastic under the two elastic launchers: one worker SIGKILLed after the first epoch, the
job goes on, says so, exits 0 and reaches the accuracy of an undisturbed run; a stopped worker is
named by the stall report.

horovodrun's discovery script lists this host under two names, one slot each: horovod blacklists
the host of a worker that failed, and with both slots under one name ("localhost:2") the
survivor's host is blacklisted with it and the driver ends the job ("blacklisted slots count == 2
-> stop running"). `paraflow run --elastic` writes the same script.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
from conftest import ROOT, requires_horovod
from elastic_kill import run_and_kill

from paraflow.environment.launchers import free_port
from paraflow.environment.mpi_library import find_tool

TRAIN = [str(ROOT / "train.py"), "--elastic", "--data", "digits", "--epochs", "12"]
LOCAL_HOST_TWICE = "#!/bin/sh\necho localhost:1\necho 127.0.0.1:1\n"


def horovodrun(tmp_path) -> list:
    script = tmp_path / "discover.sh"
    script.write_text(LOCAL_HOST_TWICE)
    script.chmod(0o755)
    tool = find_tool("horovodrun") or "horovodrun"
    return [tool, "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script", str(script), sys.executable]


def torchrun() -> list:
    endpoint = f"127.0.0.1:{free_port('127.0.0.1')}"
    elastic = ["--nnodes", "1:1", "--nproc_per_node", "2", "--max-restarts", "2"]
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    return [sys.executable, "-m", "torch.distributed.run", *elastic, *rendezvous]


CASES = [
    pytest.param("horovod", "rolled back to epoch=1", id="horovod-horovodrun", marks=requires_horovod),
    pytest.param("ddp-gloo", "restart 1: restored epoch=1", id="ddp-gloo-torchrun"),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("backend", "recovered"), CASES)
def test_a_worker_killed_after_the_first_epoch_costs_the_job_nothing_but_the_steps_since_the_commit(
    no_leftovers, tmp_path, backend, recovered
):
    out = tmp_path / "result.json"
    launcher = horovodrun(tmp_path) if backend == "horovod" else torchrun()
    env = {**no_leftovers, "TMPDIR": str(tmp_path)}
    cmd = [*launcher, *TRAIN, "--backend", backend, "--json-out", str(out)]
    result = run_and_kill(cmd, env, str(ROOT), "epoch 1/12", rank=1, timeout=200)
    text = result["stdout"] + result["stderr"]
    assert not result["timed_out"], text[-4000:]
    assert result["killed_pid"], f"no worker of rank 1 was found to kill:\n{text[-3000:]}"
    assert result["returncode"] == 0, text[-5000:]
    assert recovered in text, f"the job did not say it recovered:\n{text[-4000:]}"
    summary = json.loads(out.read_text())
    assert summary["recoveries"] == 1 and summary["epochs_run"] == 12
    assert summary["accuracy"] >= 0.90, summary["accuracy"]
    left = [p for p in (tmp_path / f"paraflow-{os.getuid()}").glob("elastic-*")] if backend != "horovod" else []
    assert left == [], f"the commits' checkpoint folder was left behind: {left}"


@requires_horovod
@pytest.mark.timeout(240)
def test_a_stopped_worker_is_named_by_the_stall_report_within_the_timeout(no_leftovers, tmp_path):
    env = {**no_leftovers, "PARAFLOW_TIMEOUT": "12", "PARAFLOW_STALL_THRESHOLD": "4"}
    cmd = [*horovodrun(tmp_path), *TRAIN, "--backend", "horovod"]
    result = run_and_kill(
        cmd, env, str(ROOT), "epoch 1/12", rank=1, timeout=200, sig=signal.SIGSTOP, end_when="paraflow stall:"
    )
    text = result["stdout"] + result["stderr"]
    assert result["killed_pid"], f"no worker of rank 1 was found to stop:\n{text[-3000:]}"
    assert "paraflow stall:" in text, f"no stall report:\n{text[-4000:]}"
    report = text[text.index("paraflow stall:") :]
    assert "rank 1" in report, report[:3000]
    assert result["answered_after_s"] is not None and result["answered_after_s"] <= 12, result["answered_after_s"]
