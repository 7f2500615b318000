"""Run a launch command and SIGKILL one of its workers once its output shows a given line."""

from __future__ import annotations

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


def run_and_kill(cmd: list, env: dict, cwd: str, when: str, rank: int, timeout: float) -> dict:
    """Start `cmd` in a session of its own; when a line of its output contains `when`, SIGKILL the
    worker of `rank` (once). Returns returncode, stdout, stderr and the kill's time (or None)."""
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    out, err, killed = [], [], {}

    def pump(stream, lines, watch):
        for line in stream:
            lines.append(line)
            if watch and when in line and "at" not in killed:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    victim = worker_of_rank(proc.pid, rank)
                    if victim is not None:
                        victim.send_signal(signal.SIGKILL)
                        killed["at"], killed["pid"] = time.monotonic(), victim.pid
                        break
                    time.sleep(0.05)

    threads = [
        threading.Thread(target=pump, args=(proc.stdout, out, True), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, err, True), daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        proc.wait(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for t in threads:
        t.join(timeout=10)
    return {
        "returncode": proc.returncode,
        "timed_out": timed_out,
        "stdout": "".join(out),
        "stderr": "".join(err),
        "killed_pid": killed.get("pid"),
    }
