"""Launch a job, watch its output as it comes, and stop it once the test has seen what it waits for.

For jobs that would otherwise hang until paraflow's default timeout (600 s): the stall report
must appear long before, and the test ends the job as soon as it has.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from conftest import RANK_ENV, ROOT

from paraflow.tools.launch import kill_tree, launch_command


@dataclass
class Watched:
    """What a watched launch printed (stdout and stderr together), and how it ended."""

    output: str
    seen: bool  # `until` became true
    exited: Optional[int]  # the launcher's exit status if it ended by itself, else None (killed)


def launch_until(
    launcher: str,
    nproc: int,
    script: list,
    until: Callable[[str], bool],
    limit: Callable[[str], float],
    env: Optional[dict] = None,
) -> Watched:
    """Run `script` under `launcher` until `until(output)` or `limit(output)` seconds have passed.

    Args:
        until: True once the output holds what the test waits for; the job is then killed.
        limit: seconds since the start the test allows, given the output so far (so a bound can
            start from an event the job prints).
        env: variables to add; None removes one (e.g. PARAFLOW_TIMEOUT, to run with the default).
    """
    extra = {**RANK_ENV, **(env or {})}
    command = launch_command(launcher, nproc, [str(s) for s in script], env_keys=[k for k, v in extra.items() if v])
    full_env = {k: v for k, v in {**os.environ, **extra}.items() if v is not None}
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full_env,
        cwd=str(ROOT),
        start_new_session=True,
    )
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    start, seen, exited = time.monotonic(), False, None
    try:
        while True:
            text = "".join(chunks)
            if until(text):
                seen = True
                break
            if proc.poll() is not None:
                reader.join(5)
                seen, exited = until("".join(chunks)), proc.returncode
                break
            if time.monotonic() - start > limit(text):
                break
            time.sleep(0.2)
    finally:
        kill_tree(proc.pid)
        proc.wait(10)
        reader.join(5)
    return Watched("".join(chunks), seen, exited)
