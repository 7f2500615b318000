"""Run a launch command and signal one of its workers (SIGKILL, SIGSTOP) once its output shows a given line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from typing import Optional

import psutil

RANK_VARIABLES = ("HOROVOD_RANK", "RANK")


def worker_of_rank(root: int, rank: int) -> Optional[psutil.Process]:
    """The process under `root` running train.py whose launcher gave it `rank` (at its start)."""
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            if not any(part.endswith("train.py") for part in child.cmdline()):
                continue
            env = child.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(env.get(name) == str(rank) for name in RANK_VARIABLES):
            return child
    return None


def run_and_kill(
    cmd: list,
    env: dict,
    cwd: str,
    when: str,
    rank: int,
    timeout: float,
    sig: int = signal.SIGKILL,
    end_when: Optional[str] = None,
) -> dict:
    """Start `cmd` in a session of its own; when a line of its output contains `when`, send `sig` to
    the worker of `rank` (once); when one contains `end_when`, SIGKILL the whole session. Returns
    returncode, timed_out, stdout, stderr, the signalled pid (or None) and the seconds from the
    signal to the first line after it that contains "paraflow elastic:" or `end_when` (or None)."""
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    out, err, killed = [], [], {}
    ended = threading.Event()

    def pump(stream, lines, watch):
        for line in stream:
            lines.append(line)
            answer = "paraflow elastic:" in line or bool(end_when and end_when in line)
            if "at" in killed and "answer" not in killed and answer:
                killed["answer"] = time.monotonic() - killed["at"]
            if end_when and end_when in line:
                ended.set()
            if watch and when in line and "at" not in killed:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    victim = worker_of_rank(proc.pid, rank)
                    if victim is not None:
                        victim.send_signal(sig)
                        killed["at"], killed["pid"] = time.monotonic(), victim.pid
                        break
                    time.sleep(0.05)

    threads = [
        threading.Thread(target=pump, args=(proc.stdout, out, True), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, err, True), daemon=True),
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline and not ended.is_set():
        time.sleep(0.05)
    timed_out = proc.poll() is None and not ended.is_set()
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for child in _stopped_or_left(killed.get("pid")):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    for t in threads:
        t.join(timeout=10)
    return {
        "returncode": proc.returncode,
        "timed_out": timed_out,
        "stdout": "".join(out),
        "stderr": "".join(err),
        "killed_pid": killed.get("pid"),
        "answered_after_s": killed.get("answer"),
    }


def _stopped_or_left(pid: Optional[int]) -> list:
    """The signalled worker, if it outlived its session (a stopped process left in another group)."""
    if pid is None:
        return []
    try:
        return [psutil.Process(pid)]
    except psutil.NoSuchProcess:
        return []
