"""A launch kills a stopped process of its own once it has been sent SIGTERM, and no other.

Real processes, no launcher: a stopped process cannot act on SIGTERM, so a launcher that ends the
job with SIGTERM and a long grace before SIGKILL would wait that grace out.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import ROOT
from reliability.faultkit import process_state

from paraflow.tools.launch import end_stopped, run_launch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process states from /proc")


def wait_for_state(proc: subprocess.Popen, letter: str) -> None:
    """Wait (at most 30 s) until `proc` is in state `letter`."""
    deadline = time.monotonic() + 30
    while process_state(proc.pid) != letter:
        assert time.monotonic() < deadline, f"process {proc.pid} never reached state {letter!r}"
        time.sleep(0.01)


@pytest.mark.timeout(60)
def test_only_a_stopped_process_with_sigterm_waiting_is_killed():
    asked, quiet, running = (subprocess.Popen(["sleep", "60"]) for _ in range(3))
    try:
        for proc in (asked, quiet):
            proc.send_signal(signal.SIGSTOP)
            wait_for_state(proc, "T")
        asked.terminate()  # stays pending while the process is stopped
        assert process_state(asked.pid) == "T"

        assert end_stopped(os.getpid()) == [asked.pid]

        assert asked.wait(timeout=30) == -signal.SIGKILL
        assert process_state(quiet.pid) == "T" and quiet.poll() is None
        assert running.poll() is None and process_state(running.pid) in "RS"
    finally:
        for proc in (asked, quiet, running):
            proc.kill()
            proc.wait()


#: A launcher in miniature: its worker stops itself; the launcher ends it as torchrun's agent
#: does, SIGTERM and then SIGKILL only after a grace far longer than the launch may take.
LAUNCHER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    from pathlib import Path

    worker = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"])
    while Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        time.sleep(0.01)
    worker.terminate()
    try:
        worker.wait(600)
    except subprocess.TimeoutExpired:
        worker.kill()
        sys.exit("the grace ran out")
    print("worker ended by signal", -worker.returncode)
    sys.exit(1)
    """
)


@pytest.mark.timeout(200)
def test_a_launch_does_not_wait_out_its_launchers_grace_for_a_stopped_worker():
    result = run_launch([sys.executable, "-c", LAUNCHER], timeout=120, cwd=str(ROOT))
    assert not result.timed_out, result.stderr
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"worker ended by signal {int(signal.SIGKILL)}" in result.stdout


@pytest.mark.timeout(60)
def test_a_launch_past_its_timeout_is_killed_with_what_it_started():
    script = "import subprocess, sys, time; print(subprocess.Popen(['sleep', '60']).pid, flush=True); time.sleep(60)"
    result = run_launch([sys.executable, "-c", script], timeout=10, cwd=str(ROOT))
    assert result.timed_out and result.returncode == -signal.SIGKILL
    # Killed: gone at once, or within moments while the kernel finishes its exit (the sleep alone
    # would last 50 s more).
    child, deadline = int(result.stdout.split()[0]), time.monotonic() + 5
    while process_state(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_state(child), "the launch's child outlived it"
