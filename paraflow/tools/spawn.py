"""``paraflow.launch(fn, *args, nprocs=N)``: run a function in N fresh processes, each in a backend.

Why fresh interpreters: forking the caller breaks once it has touched CUDA or started threads (a
notebook kernel has both), and multiprocessing's "spawn" imports the function again by name, which
fails for a function defined in a notebook cell or read from stdin. So the function and its
arguments travel by value (cloudpickle, as horovod.run does) to ``python -m
paraflow.tools.spawn_worker`` processes (:mod:`paraflow.tools.spawn_worker`); their output comes
back line by line with a rank prefix, and each return value or traceback through a file. Every
worker runs in a session of its own and is killed with its descendants when the call ends, fails,
runs out of time or is interrupted.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ..environment.launchers import free_port, launcher_variables
from ..errors import ConfigurationError, MissingDependencyError
from .launch import kill_group, kill_tree
from .spawn_outcomes import RankOutcome, raise_for_outcomes, with_sources

__all__ = ["launch", "run_workers", "RankOutcome", "DEFAULT_TIME_LIMIT"]

DEFAULT_TIME_LIMIT = 3600.0
_POLL_S = 0.05


def launch(
    fn: Callable[..., Any],
    *args: Any,
    nprocs: int,
    backend: str = "ddp",
    time_limit: Optional[float] = DEFAULT_TIME_LIMIT,
    **options: Any,
) -> list:
    """Run ``fn(backend, *args)`` in `nprocs` new processes, each inside an initialised backend.

    Works from a script, from ``python -`` and in a Jupyter kernel: `fn` may be defined anywhere,
    it is sent by value. Each worker's output is printed here with a ``[rankN]`` prefix.

    Args:
        fn: called on every rank with the initialised backend and `args`; what it returns must
            be picklable.
        *args: passed to `fn` after the backend (picklable).
        nprocs: the number of processes (ranks), all on this host.
        backend: the registered backend name ("ddp", "ddp-gloo", "horovod", ...).
        time_limit: seconds the whole call may take before every worker is stopped (None: no limit).
        **options: backend options, as for :func:`paraflow.init` (``timeout`` is the collectives').

    Returns:
        The return values of `fn`, in rank order.

    Raises:
        RankFailedError: a rank raised or died; names the rank and carries its traceback. The
            other ranks are stopped.
        LaunchTimeoutError: ranks were still running after `time_limit` seconds; all were stopped.
        MissingDependencyError: cloudpickle is not installed.
    """
    from ..core.registry import create, spec
    from .spawn_worker import call_in_backend

    if not callable(fn):
        raise ConfigurationError(f"paraflow.launch needs a function to run, got {type(fn).__name__}.")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ConfigurationError(f"nprocs must be a positive integer, got {nprocs!r}.")
    if time_limit is not None and (
        isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or time_limit <= 0
    ):
        raise ConfigurationError(f"time_limit must be a positive number of seconds or None, got {time_limit!r}.")
    if nprocs > 1 and not spec(backend).load().MULTI_PROCESS:
        raise ConfigurationError(
            f"backend {backend!r} runs in one process; call paraflow.launch(fn, nprocs=1, backend={backend!r}) "
            f"or pick a multi-process backend: paraflow.launch(fn, nprocs={nprocs}, backend='ddp')."
        )
    create(backend, **options)  # bad options fail here, before any process starts
    try:
        import cloudpickle
    except ImportError:
        raise MissingDependencyError(
            "paraflow.launch sends the function to its processes with cloudpickle, which is not "
            "installed (paraflow requires it; was it uninstalled?): `pip install cloudpickle`."
        ) from None
    outcomes = run_workers(call_in_backend, (fn, backend, options, args), nprocs, time_limit, pickler=cloudpickle)
    for outcome in outcomes:
        if outcome.error:
            outcome.error["traceback"] = with_sources(outcome.error["traceback"], fn)
    raise_for_outcomes(outcomes, time_limit)
    return [o.value for o in outcomes]


def run_workers(
    entry: Callable[..., Any],
    args: tuple,
    nprocs: int,
    time_limit: Optional[float],
    *,
    pickler: Any = pickle,
    stream: bool = True,
    stop_on_failure: bool = True,
    rank_env: Optional[dict] = None,
) -> list[RankOutcome]:
    """Run ``entry(*args)`` in `nprocs` worker processes on this host; one outcome per rank.

    Args:
        entry: a picklable callable (by `pickler`).
        args: its arguments.
        nprocs: how many workers.
        time_limit: seconds until every worker still running is killed (None: no limit).
        pickler: the module that pickles the job (``pickle`` or ``cloudpickle``).
        stream: print each worker's output here with a ``[rankN]`` prefix (else only keep its tail).
        stop_on_failure: kill the others as soon as one rank fails.
        rank_env: extra variables per rank, rank -> {name: value}.
    """
    if not sys.executable:
        raise ConfigurationError("this Python does not know its own executable (sys.executable is empty).")
    workdir = Path(tempfile.mkdtemp(prefix="paraflow-launch-"))
    procs: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    outcomes = [RankOutcome(rank) for rank in range(nprocs)]
    try:
        try:
            job = pickler.dumps({"entry": entry, "args": args})
        except Exception as exc:
            raise ConfigurationError(
                f"paraflow.launch cannot send the function or its arguments to the workers "
                f"({type(exc).__name__}: {exc}). Pass only picklable values (no open files, locks, "
                "sockets or generators); create such objects inside the function."
            ) from exc
        (workdir / "job.pkl").write_bytes(job)
        (workdir / "sys_path.json").write_text(json.dumps([p for p in sys.path if isinstance(p, str)]))
        port = free_port("127.0.0.1")
        sinks = (sys.stdout, sys.stderr) if stream else (None, None)
        lock = threading.Lock()
        for rank in range(nprocs):
            env = _worker_env(rank, nprocs, port, (rank_env or {}).get(rank, {}))
            proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "paraflow.tools.spawn_worker", str(workdir)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
            procs.append(proc)
            for pipe, sink in zip((proc.stdout, proc.stderr), sinks):
                thread = threading.Thread(target=_pump, args=(pipe, outcomes[rank], sink, lock), daemon=True)
                thread.start()
                readers.append(thread)
        _wait(procs, outcomes, workdir, time_limit, stop_on_failure)
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
            kill_group(proc.pid)  # anything a worker started in its session
            proc.wait()
        for thread in readers:
            thread.join(timeout=5)
        shutil.rmtree(workdir, ignore_errors=True)
    return outcomes


# ---------------------------------------------------------------- helpers
def _worker_env(rank: int, nprocs: int, port: int, extra: dict) -> dict:
    """This process's environment without a parent job's launcher variables, plus the worker's own."""
    inherited = set(launcher_variables(os.environ)) | {"PARAFLOW_BACKEND"}
    env = {k: v for k, v in os.environ.items() if k not in inherited}
    root = str(Path(__file__).resolve().parents[2])
    if Path(root).name not in ("site-packages", "dist-packages"):  # a checkout: make it importable
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env.update(
        {
            "PARAFLOW_RANK": str(rank),
            "PARAFLOW_WORLD_SIZE": str(nprocs),
            "PARAFLOW_LOCAL_RANK": str(rank),
            "PARAFLOW_LOCAL_WORLD_SIZE": str(nprocs),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONUNBUFFERED": "1",
            "PARAFLOW_LAUNCH_PARENT": str(os.getpid()),
        }
    )
    env.update(extra)
    return env


def _pump(pipe, outcome: RankOutcome, sink, lock: threading.Lock) -> None:
    """Copy one worker stream to `sink` line by line with its rank prefix; keep the last lines."""
    for raw in iter(pipe.readline, b""):
        line = raw.decode(errors="replace").rstrip("\r\n")
        outcome.tail.append(line)
        if sink is not None:
            with lock:
                try:
                    sink.write(f"[rank{outcome.rank}] {line}\n")
                    sink.flush()
                except (OSError, ValueError):  # the caller's stream was closed
                    pass
    pipe.close()
    outcome.ended_at = min(outcome.ended_at or float("inf"), time.time())


def _wait(procs, outcomes, workdir: Path, time_limit: Optional[float], stop_on_failure: bool) -> None:
    deadline = None if time_limit is None else time.monotonic() + time_limit
    while True:
        for proc, outcome in zip(procs, outcomes):
            if outcome.returncode is None and proc.poll() is not None:
                outcome.returncode = proc.returncode
                outcome.ended_at = min(outcome.ended_at or float("inf"), time.time())
                _read_result(outcome, workdir / f"rank{outcome.rank}.result")
        done = [o.returncode is not None for o in outcomes]
        if all(done) or (stop_on_failure and any(o.status in ("error", "died") for o in outcomes)):
            return
        if deadline is not None and time.monotonic() > deadline:
            return
        time.sleep(_POLL_S)


def _read_result(outcome: RankOutcome, path: Path) -> None:
    try:
        data = path.read_bytes()
    except OSError:
        outcome.status = "died"
        return
    try:
        kind, payload = pickle.loads(data)
    except Exception as exc:
        outcome.status = "error"
        outcome.error = {
            "type": type(exc).__name__,
            "message": f"the return value of rank {outcome.rank} cannot be loaded in the caller: {exc}",
            "traceback": f"{type(exc).__name__}: {exc}\n",
            "time": time.time(),
        }
        return
    if kind == "ok":
        outcome.status, outcome.value = "ok", payload
    else:
        outcome.status, outcome.error = "error", payload
