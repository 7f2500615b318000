"""Helpers for the fault tests: launches with a short paraflow timeout, EVENT lines, hand-started ranks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from conftest import RANK_ENV, ROOT, launch

from paraflow.environment.launchers import free_port
from paraflow.tools.launch import kill_group

FAULT_WORKERS = Path(__file__).resolve().parent / "workers"
#: The paraflow timeout the fault workers run with (seconds): short, so tests finish quickly.
TIMEOUT_S = 10
#: How long a launcher may take to start Python and torch in every rank on a loaded 2-core machine.
STARTUP_S = 60


def process_state(pid: int) -> str:
    """The process's state letter from /proc ('T': stopped), or '' once it has exited (or is a zombie)."""
    try:
        letter = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    return "" if letter == "Z" else letter


def fault_env(**extra: str) -> dict:
    """Variables every fault worker gets: one thread per rank and the short timeout."""
    return {"PARAFLOW_TIMEOUT": str(TIMEOUT_S), **extra}


def run_worker(launcher: str, nproc: int, script: str, *args, timeout: float = 150, env: dict | None = None):
    """Launch tests/reliability/workers/`script` with `args`; fail the test if the launch itself hangs.

    The ranks' EVENT records come through a file (workers/report.py), appended to the stdout
    of the result whole, in the order the ranks wrote them.
    """
    fd, path = tempfile.mkstemp(prefix="pf-tests-events-")
    os.close(fd)
    try:
        result = launch(
            launcher,
            nproc,
            [FAULT_WORKERS / script, *args],
            timeout=timeout,
            env=fault_env(FAULT_EVENTS=path, **(env or {})),
        )
        return replace(result, stdout=result.stdout + Path(path).read_text())
    finally:
        os.unlink(path)


def events(text: str) -> list[dict]:
    """The ``EVENT {json}`` records workers printed, in order (robust to ranks' lines interleaving)."""
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(text, match.end())[0] for match in re.finditer(r"EVENT (?=\{)", text)]


@dataclass
class RankResult:
    """One hand-started rank: exit status and output."""

    rank: int
    returncode: int
    stdout: str
    stderr: str


def start_by_hand(
    script: str,
    ranks: list[int],
    world_size: int,
    *args,
    port: int | None = None,
    timeout: float = 90,
    env: dict | None = None,
) -> list[RankResult]:
    """Start the given ranks as plain processes with torchrun's variables set by hand.

    Every process runs in its own session and is killed with its whole group when it ends or
    when `timeout` passes, so none outlives the call.
    """
    port = port or free_port()
    procs = []
    for rank in ranks:
        variables = {
            **os.environ,
            **RANK_ENV,
            **fault_env(**(env or {})),
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(FAULT_WORKERS / script), *map(str, args)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=variables,
                cwd=str(ROOT),
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + timeout
    results = []
    try:
        for rank, proc in zip(ranks, procs):
            try:
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_group(proc.pid)
                out, err = proc.communicate()
                err += f"\n[killed by the test after {timeout} s]"
            results.append(RankResult(rank, proc.returncode, out, err))
    finally:
        for proc in procs:
            kill_group(proc.pid)
    return results
