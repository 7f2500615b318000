"""``paraflow.launch(fn, *args, nprocs=N)``: run a function in N fresh processes, each in a backend.

Why fresh interpreters: forking the caller breaks once it has touched CUDA or started threads (a
notebook kernel has both), and multiprocessing's "spawn" imports the function again by name, which
fails for a function defined in a notebook cell or read from stdin. So the function and its
arguments travel by value (cloudpickle, as horovod.run does) to ``python -m paraflow.tools.spawn
WORKDIR`` processes; their output comes back line by line with a rank prefix, and each return
value or traceback through a file. Every worker runs in a session of its own and is killed with
its descendants when the call ends, fails, runs out of time or is interrupted.

A worker runs with PARAFLOW_RANK, PARAFLOW_WORLD_SIZE, PARAFLOW_LOCAL_RANK,
PARAFLOW_LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (the "paraflow-launch" launcher). Its
job is ``WORKDIR/job.pkl``, unpickled once the caller's ``sys.path`` (``WORKDIR/sys_path.json``) is
added to its own; the outcome goes to ``WORKDIR/rank<R>.result`` as ``("ok", value)`` or
``("error", {type, message, traceback, time})``. A rank that raised leaves at once, without
shutting its backend down: the caller stops the others.
"""

from __future__ import annotations

import collections
import json
import linecache
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..environment.launchers import free_port, launcher_variables
from ..errors import ConfigurationError, LaunchTimeoutError, MissingDependencyError, RankFailedError
from ..reliability.activity import ranks_text
from ..reliability.last_words import JOB_DIR_ENV, job_ended, mark_ended, new_job_directory, report_dead_ranks
from ..reliability.translation import is_peer_lost
from .launch import kill_group, kill_tree, prctl

__all__ = ["launch", "run_workers", "RankOutcome", "DEFAULT_TIME_LIMIT", "call_in_backend"]

DEFAULT_TIME_LIMIT = 3600.0
_POLL_S = 0.05
_TAIL_LINES = 30
_DYNAMIC_FRAME = re.compile(r'^( *)File "<dynamic-code>", line (\d+), in (\S+)$', re.MULTILINE)
PARENT_ENV = "PARAFLOW_LAUNCH_PARENT"


@dataclass
class RankOutcome:
    """How one worker ended: "ok", "error" (raised), "died" (no result) or "unfinished" (killed at the limit)."""

    rank: int
    status: str = "unfinished"
    value: Any = None
    error: Optional[dict] = None
    returncode: Optional[int] = None
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=_TAIL_LINES))
    ended_at: Optional[float] = None

    def when(self) -> float:
        """When it failed: its error's time, else when its output closed or its exit was seen."""
        return (self.error or {}).get("time") or self.ended_at or float("inf")

    def cause_order(self) -> tuple:
        """Sorts the rank that failed on its own first: a rank that lost a peer failed because of that peer.

        A killed rank's time is when the caller saw it go, which can come after the error its
        peer raised on losing the connection.
        """
        return bool((self.error or {}).get("peer_lost")), self.when()

    def summary(self) -> str:
        """One line: what it raised or how it died."""
        if self.error:
            lines = self.error["message"].strip().splitlines()
            return f"{self.error['type']}: {lines[0] if lines else ''}"
        return _exit_text(self.returncode)


def launch(
    fn: Callable[..., Any],
    *args: Any,
    nprocs: int,
    backend: str = "ddp",
    time_limit: Optional[float] = DEFAULT_TIME_LIMIT,
    **options: Any,
) -> list:
    """`paraflow.launch` (documented there): run `fn(backend, *args)` in `nprocs` new processes."""
    from ..core.registry import create, spec

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
    outcomes = run_workers(call_in_backend, (fn, backend, options, args), nprocs, time_limit)
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
    stream: bool = True,
    stop_on_failure: bool = True,
    rank_env: Optional[dict] = None,
) -> list[RankOutcome]:
    """Run ``entry(*args)`` in `nprocs` worker processes on this host; one outcome per rank.

    Args:
        entry: a callable cloudpickle can send (by value when defined in ``__main__``).
        args: its arguments.
        nprocs: how many workers.
        time_limit: seconds until every worker still running is killed (None: no limit).
        stream: print each worker's output here with a ``[rankN]`` prefix (else only keep its tail).
        stop_on_failure: kill the others as soon as one rank fails.
        rank_env: extra variables per rank, rank -> {name: value}.
    """
    if not sys.executable:
        raise ConfigurationError("this Python does not know its own executable (sys.executable is empty).")
    try:
        import cloudpickle
    except ImportError:
        raise MissingDependencyError(
            "paraflow.launch sends the function to its processes with cloudpickle, which is not "
            "installed (paraflow requires it; was it uninstalled?): `pip install cloudpickle`."
        ) from None
    workdir = Path(tempfile.mkdtemp(prefix="paraflow-launch-"))
    procs: list[subprocess.Popen] = []
    records: Optional[Path] = None
    dead: list = []
    readers: list[threading.Thread] = []
    outcomes = [RankOutcome(rank) for rank in range(nprocs)]
    try:
        try:
            job = cloudpickle.dumps({"entry": entry, "args": args})
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
        records = new_job_directory()  # where the ranks keep their last words
        for rank in range(nprocs):
            env = {**_worker_env(rank, nprocs, port, (rank_env or {}).get(rank, {})), JOB_DIR_ENV: str(records)}
            proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "paraflow.tools.spawn", str(workdir)],
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
        dead = report_dead_ranks(records, once=False)  # before the ranks still running are stopped
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
            kill_group(proc.pid)  # anything a worker started in its session
            proc.wait()
        for thread in readers:
            thread.join(timeout=5)
        shutil.rmtree(workdir, ignore_errors=True)
        if records is not None:
            job_ended(records, dead)
    return outcomes


# ---------------------------------------------------------------- the caller's side
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
            PARENT_ENV: str(os.getpid()),
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


def raise_for_outcomes(outcomes: list[RankOutcome], time_limit: Optional[float]) -> None:
    """Raise RankFailedError for the rank that failed first on its own, else LaunchTimeoutError if one was stopped."""
    n = len(outcomes)
    failed = [o for o in outcomes if o.status in ("error", "died")]
    if failed:
        first = min(failed, key=RankOutcome.cause_order)
        others = {o.rank: o.summary() for o in failed if o is not first}
        if first.error:
            kind, text = first.error["type"], first.error["traceback"]
            head = f"rank {first.rank} of {n} raised {first.summary()}"
        else:
            kind, text = _exit_text(first.returncode), "\n".join(first.tail) or "(no output)"
            head = f"rank {first.rank} of {n} died ({kind}) without returning; its last output is below"
        also = "".join(f"\nrank {r} failed too: {s}" for r, s in sorted(others.items()))
        stopped = [o.rank for o in outcomes if o.status == "unfinished"]
        ended = f"\nThe others were stopped: {ranks_text(stopped)}." if stopped else ""
        raise RankFailedError(
            f"{head}\n\n--- rank {first.rank} ---\n{text.rstrip()}\n---{also}{ended}", first.rank, kind, text, others
        )
    unfinished = [o.rank for o in outcomes if o.status == "unfinished"]
    if unfinished:
        last = outcomes[unfinished[0]]
        tail = "\n".join(list(last.tail)[-10:]) or "(no output)"
        raise LaunchTimeoutError(
            f"{ranks_text(unfinished)} of {n} did not finish within time_limit={time_limit:g} s; "
            f"every worker was stopped. Last output of rank {unfinished[0]}:\n{tail}\nPass a larger "
            "time_limit=SECONDS for longer runs; PARAFLOW_DEBUG=1 makes every rank print each collective "
            "it enters, which shows where one waits.",
            unfinished,
        )


def with_sources(text: str, fn: Callable[..., Any]) -> str:
    """Put the caller's file names and source lines back into frames of code sent by value.

    cloudpickle names every function it sends "<dynamic-code>"; `fn` and the functions of the
    caller's ``__main__`` (a script, ``python -``, a notebook's cells) are found again by name.
    """
    files = {}
    main = sys.modules.get("__main__")
    for obj in list(vars(main).values()) if main is not None else []:
        code = getattr(obj, "__code__", None)
        if code is not None:
            files.setdefault(code.co_name, code.co_filename)
    code = getattr(fn, "__code__", None)
    if code is not None:
        files[code.co_name] = code.co_filename

    def restore(match: re.Match) -> str:
        indent, line, name = match.group(1), int(match.group(2)), match.group(3)
        if name not in files:
            return match.group(0)
        source = linecache.getline(files[name], line).strip()
        frame = f'{indent}File "{files[name]}", line {line}, in {name}'
        return frame + (f"\n{indent}  {source}" if source else "")

    return _DYNAMIC_FRAME.sub(restore, text)


def _exit_text(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


# ---------------------------------------------------------------- the worker's side
def call_in_backend(fn: Callable[..., Any], backend: str, options: dict, args: tuple) -> Any:
    """Initialise `backend` for this rank, return ``fn(backend, *args)``, then shut the backend down."""
    from ..core.registry import create

    instance = create(backend, **options).init()
    value = fn(instance, *args)
    instance.shutdown()
    return value


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this process when the caller dies, so no worker outlives a killed caller."""
    if not parent or not prctl(1, signal.SIGKILL):  # PR_SET_PDEATHSIG
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
        "peer_lost": is_peer_lost(exc),
    }


def main(argv: Optional[list] = None) -> None:
    """A worker: load the job in the folder named on the command line, run it, write its outcome."""
    import cloudpickle  # values of classes defined in a notebook travel back by value too

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
        data = cloudpickle.dumps(record)
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
        mark_ended()  # its error is reported: the last words must not count it as died
        os._exit(1)  # no shutdown, no atexit: a backend whose peers are gone could wait for them


if __name__ == "__main__":
    main()
