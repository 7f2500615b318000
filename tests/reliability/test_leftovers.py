"""The leftover-process check that runs after the whole suite can see a leaked process."""

import os
import subprocess
import sys
import uuid

from leftovers import MARKER_ENV, kill_processes, leftover_processes


def test_a_leaked_process_is_found_and_killed():
    marker = uuid.uuid4().hex
    leaked = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        env={**os.environ, MARKER_ENV: marker},
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        # Popen returns once exec has begun, before the kernel has filled in the new
        # program's environment; wait for the child to run so /proc shows its marker.
        assert leaked.stdout.readline() == b"ready\n"
        found = leftover_processes(marker, grace_s=0)
        assert list(found) == [leaked.pid] and "time.sleep(60)" in found[leaked.pid]
        kill_processes(found)
        leaked.wait(timeout=10)
        assert leftover_processes(marker, grace_s=0) == {}
    finally:
        leaked.kill()
        leaked.wait()
        leaked.stdout.close()


def test_this_session_is_marked():
    assert os.environ.get(MARKER_ENV)
