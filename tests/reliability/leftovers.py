"""Find processes a test session started that are still running.

The session puts a unique marker in its environment; every process it starts (launchers,
ranks, MPI daemons) inherits it. After the suite, any live process whose environment holds
the marker was left behind.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

MARKER_ENV = "PARAFLOW_TEST_SESSION"


def mark_session() -> str:
    """Put a fresh marker in this process's environment (inherited by its children); return it."""
    marker = uuid.uuid4().hex
    os.environ[MARKER_ENV] = marker
    return marker


def _environment(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours to read
        return b""


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; only its parent's bookkeeping is left


def leftover_processes(marker: str, grace_s: float = 5.0) -> dict[int, str]:
    """Live processes (pid -> command line) carrying `marker`, after up to `grace_s` for them to exit."""
    needle = f"{MARKER_ENV}={marker}".encode()
    deadline = time.monotonic() + grace_s
    while True:
        found = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                pid = int(entry.name)
                if needle in _environment(pid).split(b"\0") and _alive(pid):
                    found[pid] = _command(pid)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def kill_processes(pids) -> None:
    """SIGKILL each of `pids` (one by one; quiet when one is already gone)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
