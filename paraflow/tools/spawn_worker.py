"""The process side of :func:`paraflow.launch`: load the job, run it, send back its value or traceback.

Started as ``python -m paraflow.tools.spawn_worker WORKDIR`` with PARAFLOW_RANK, PARAFLOW_WORLD_SIZE,
PARAFLOW_LOCAL_RANK, PARAFLOW_LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (the
"paraflow-launch" launcher). The job is ``WORKDIR/job.pkl``, unpickled once the caller's
``sys.path`` (``WORKDIR/sys_path.json``) is added to this one's; the outcome goes to
``WORKDIR/rank<R>.result`` as ``("ok", value)`` or ``("error", {type, message, traceback, time})``.
A rank that raised leaves at once, without shutting its backend down: the caller stops the others.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

__all__ = ["call_in_backend", "main"]

PARENT_ENV = "PARAFLOW_LAUNCH_PARENT"


def call_in_backend(fn: Callable[..., Any], backend: str, options: dict, args: tuple) -> Any:
    """Initialise `backend` for this rank, return ``fn(backend, *args)``, then shut the backend down."""
    from ..core.registry import create

    instance = create(backend, **options).init()
    value = fn(instance, *args)
    instance.shutdown()
    return value


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this process when the caller dies, so no worker outlives a killed caller."""
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the caller died before the request took effect
        os._exit(1)


def _describe(exc: BaseException) -> dict:
    """What the caller re-raises: the traceback starts at the user's code, not at this module."""
    here = os.path.abspath(__file__)
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == here:
        tb = tb.tb_next
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, tb)),
        "time": time.time(),
    }


def _dumps(record: tuple) -> bytes:
    try:
        import cloudpickle  # values of classes defined in a notebook travel by value too

        return cloudpickle.dumps(record)
    except ImportError:
        return pickle.dumps(record)


def main(argv: list | None = None) -> None:
    workdir = Path((sys.argv[1:] if argv is None else argv)[0])
    _die_with_parent(int(os.environ.get(PARENT_ENV, "0")))
    rank = int(os.environ["PARAFLOW_RANK"])
    try:
        caller_path = json.loads((workdir / "sys_path.json").read_text())
        sys.path.extend(p for p in caller_path if p not in sys.path)  # modules the caller can import
        job = pickle.loads((workdir / "job.pkl").read_bytes())
        record = ("ok", job["entry"](*job["args"]))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
        record = ("error", _describe(exc))
    try:
        data = _dumps(record)
    except Exception as exc:
        error = _describe(exc)
        error["message"] = f"the return value of rank {rank} cannot be pickled: {exc}"
        record, data = ("error", error), pickle.dumps(("error", error))
    partial = workdir / f"rank{rank}.result.partial"
    partial.write_bytes(data)
    partial.replace(workdir / f"rank{rank}.result")
    if record[0] == "error":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # no shutdown, no atexit: a backend whose peers are gone could wait for them


if __name__ == "__main__":
    main()
