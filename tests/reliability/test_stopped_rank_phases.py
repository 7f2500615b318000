"""A rank that stops answering in wrap_model, wrap_optimizer or right before shutdown: every wait ends.

Rank 1 SIGSTOPs itself at the start of the phase (2 ranks, paraflow timeout 10 s). Every other
rank must be gone within 40 s of the stop, having reported a CollectiveTimeoutError that names
rank 1, whether it was raised (and caught by the worker) or printed by paraflow's watchdog just
before it ended a process whose horovod wait could not be interrupted. The test kills the stopped
rank once the others are gone (a stopped process waits for SIGKILL), and checks that nothing of
the launch is left once the launcher has ended.
"""

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import requires_horovod
from faultkit import STARTUP_S, TIMEOUT_S, events, process_state, run_worker

PHASES = ("wrap_model", "wrap_optimizer", "shutdown")
LAUNCHES = [
    pytest.param("horovod", "mpirun", id="horovod-mpirun", marks=requires_horovod),
    pytest.param("horovod", "horovodrun", id="horovod-horovodrun", marks=requires_horovod),
    pytest.param("ddp-gloo", "torchrun", id="ddp-gloo-torchrun"),
    pytest.param("fsdp", "torchrun", id="fsdp-torchrun"),
]
#: How soon after the stop every other rank must be gone.
GONE_WITHIN_S = 40
_WATCHDOG_LINE = re.compile(r"^(?:\[\d+\]<stderr>:)?paraflow\.errors\.CollectiveTimeoutError: (.*)$", re.MULTILINE)


def alive(pid: int) -> bool:
    return bool(process_state(pid))


def pids(directory: Path) -> dict:
    found = {}
    for path in directory.glob("rank*.pid"):
        try:
            found[int(path.stem[4:])] = int(path.read_text())
        except ValueError:  # being written
            pass
    return found


def watch_launch(backend, launcher, phase, directory):
    """Run the launch in a thread; note when each rank's process is gone; kill the stopped rank
    once every other one is gone. Returns (launch result, stop time, {rank: time gone}, pids)."""
    outcome = {}
    launch = threading.Thread(
        target=lambda: outcome.update(
            result=run_worker(launcher, 2, "phases.py", backend, phase, directory, timeout=STARTUP_S + 120)
        )
    )
    launch.start()
    gone, seen, stopped_at = {}, {}, None
    while launch.is_alive():
        seen.update(pids(directory))
        stop_file = directory / "rank1.pid"
        if stopped_at is None and stop_file.exists() and seen.get(1):
            if process_state(seen[1]) == "T":
                stopped_at = time.time()
        for rank, pid in seen.items():
            if rank != 1 and rank not in gone and not alive(pid):
                gone[rank] = time.time()
        if stopped_at is not None and 1 in seen and 0 in gone and alive(seen[1]):
            for sig in (signal.SIGCONT, signal.SIGKILL):  # ours to clean up: a stopped rank waits for SIGKILL
                try:
                    os.kill(seen[1], sig)
                except ProcessLookupError:
                    pass
        time.sleep(0.1)
    launch.join()
    ended = time.time()
    for rank, pid in seen.items():  # gone between the last look and the launcher's end
        if rank != 1 and rank not in gone and not alive(pid):
            gone[rank] = ended
    return outcome["result"], stopped_at, gone, seen


def timeout_error_of_rank0(result) -> str:
    """Rank 0's CollectiveTimeoutError message: raised (an EVENT) or printed by the watchdog."""
    raised = [e for e in events(result.stdout) if e.get("rank") == 0 and e.get("error")]
    if raised:
        assert raised[0]["error"] == "CollectiveTimeoutError", raised[0]
        return raised[0]["message"]
    printed = [m for m in _WATCHDOG_LINE.findall(result.stderr) if "on rank 0 of 2" in m]
    assert printed, f"rank 0 reported no timeout:\n{result.stdout}\n{result.stderr[-4000:]}"
    return printed[0]


def check_phase(backend, launcher, phase, tmp_path):
    result, stopped_at, gone, seen = watch_launch(backend, launcher, phase, tmp_path)
    stops = [e for e in events(result.stdout) if e.get("fault") == "stop"]
    assert stops and stopped_at is not None, f"rank 1 never stopped:\n{result.stdout}\n{result.stderr[-3000:]}"
    message = timeout_error_of_rank0(result)
    assert "on rank 0 of 2" in message and "rank 1 did not join it within the timeout of 10 s" in message, message
    assert 0 in gone, "rank 0 was still running when the launcher ended"
    assert gone[0] - stops[0]["time"] <= GONE_WITHIN_S, f"rank 0 was gone {gone[0] - stops[0]['time']:.1f} s after"
    assert result.returncode != 0
    assert not [pid for pid in seen.values() if alive(pid)], "a rank outlived its launcher"
    return message


def _cases():
    """Every launch and phase; the default run keeps one case per mechanism that hung before: horovod's
    watchdog (mpirun), and the end of the job on every backend and launcher: the shutdown barrier's
    timeout raised, and then nothing else waiting on the stopped rank (hvd.shutdown() would)."""
    default = {
        ("horovod-mpirun", "wrap_model"),
        ("horovod-mpirun", "shutdown"),
        ("horovod-horovodrun", "shutdown"),
        ("ddp-gloo-torchrun", "shutdown"),
        ("fsdp-torchrun", "shutdown"),
    }
    for launch in LAUNCHES:
        backend, launcher = launch.values
        for phase in PHASES:
            soak = [] if (launch.id, phase) in default else [pytest.mark.soak]
            yield pytest.param(backend, launcher, phase, id=f"{launch.id}-{phase}", marks=[*launch.marks, *soak])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend, launcher, phase", list(_cases()))
def test_a_rank_stopped_in_a_phase_ends_every_wait_with_a_timeout_naming_it(backend, launcher, phase, tmp_path):
    message = check_phase(backend, launcher, phase, tmp_path)
    assert f"timeout of {TIMEOUT_S} s" in message


@pytest.mark.timeout(300)
def test_a_rank_stopped_in_the_middle_of_an_fsdp_save_is_named_by_the_stall_report(tmp_path):
    result, stopped_at, gone, seen = watch_launch("fsdp", "torchrun", "save", tmp_path)
    assert stopped_at is not None, f"rank 1 never stopped:\n{result.stdout}\n{result.stderr[-3000:]}"
    reports = re.findall(r"paraflow stall: seen from rank 0 of 2.*?(?=\n\S|\Z)", result.stderr, re.DOTALL)
    assert reports, f"no stall report from rank 0:\n{result.stderr[-4000:]}"
    assert "rank 0: in save at phases.py" in reports[0] and "rank 1 sent no record" in reports[0], reports[0]
    raised = [e for e in events(result.stdout) if e.get("rank") == 0 and e.get("error")]
    assert raised and raised[0]["error"] == "CheckpointError", raised or result.stderr[-4000:]
    assert result.returncode != 0 and 0 in gone
    assert gone[0] - stopped_at <= GONE_WITHIN_S, f"rank 0 was gone {gone[0] - stopped_at:.1f} s after the stop"
    assert not [pid for pid in seen.values() if alive(pid)], "a rank outlived its launcher"
