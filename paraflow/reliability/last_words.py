"""Last words for a rank the communication library kills: who died, in which phase, and who was elsewhere.

When gloo, NCCL or MPI aborts a process (a C++ exception ending in ``std::terminate``, SIGABRT,
SIGSEGV inside the library), no Python code runs in that process any more: ``abort()`` re-raises
its signal, so a Python signal handler never gets the chance. So each rank of a job of several
processes keeps, from ``init`` on, two files in a job directory on local disk
(:func:`job_directory`):

- ``rank<R>.rec``: its current activity record (the phase of
  :mod:`paraflow.reliability.activity`, its call site and step, the last public collective's name,
  number and whether the rank is inside it), in a file-backed ``mmap`` that module writes. Each
  change is a few memory stores into the mapping (no system call); the kernel keeps the pages
  after the process dies, so the other ranks on the host read where it was.
- ``rank<R>.fault``: where :mod:`faulthandler` writes, from its signal-safe C handler, the fatal
  signal and every thread's Python stack (and, on SIGTERM, the stacks alone: a rank the launcher
  ended is not the one that died).

A public collective the script calls costs one small store on entry and one byte on exit; a
collective made inside another paraflow call (save's allgathers) also records the code that made
it and its tensor's size, so ranks in different collectives of one call tell apart.

A thread of each rank (:class:`LastWordsWatch`) waits on the other local ranks' process
descriptors (``pidfd``); when one ends without passing through Python's exit, the first rank to
see it prints one line on stderr::

    paraflow: rank 0 of 2 died (SIGABRT) in save at train.py:52, in allgather as collective #6
    (object_collectives.py:40, 1 int64); rank 1 was elsewhere: in save at train.py:52, in allgather
    as collective #6 (object_collectives.py:44, 7826 uint8). Its Python stacks: .../rank0.fault.

A survivor's error for the lost peer carries the same sentence (:func:`dead_peers_text`), and so do
``paraflow run`` and ``paraflow.launch`` when the job ended with a dead rank (they choose the job
directory through ``PARAFLOW_JOB_DIR``). Reading another rank's record needs the same host.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from ..environment.launchers import job_key
from .activity import COLLECTIVES, Activity, LastWords, RecordedActivity, ranks_text, read_record

__all__ = [
    "JOB_DIR_ENV",
    "LastWordsWatch",
    "dead_peers_text",
    "job_directory",
    "report_dead_ranks",
    "start_last_words",
]

#: A directory the launcher chose for this job's records (``paraflow run`` and ``paraflow.launch`` set it).
JOB_DIR_ENV = "PARAFLOW_JOB_DIR"

_SIGNALS = {
    "Aborted": "SIGABRT",
    "Segmentation fault": "SIGSEGV",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}


def job_directory(environ: Optional[dict] = None) -> Path:
    """This job's directory for the records on this host: ``PARAFLOW_JOB_DIR``, else one under the
    temporary directory named after the launcher's job (every local rank of one job finds the same)."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(JOB_DIR_ENV)
    if chosen:
        return Path(chosen)
    key = job_key(environ) or f"parent-{os.getppid()}"  # the launcher's own name of this job
    key = re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:100]
    return _base() / f"job-{key}"


def _base() -> Path:
    """Where paraflow's own job directories go: one folder per user under the temporary directory."""
    return Path(tempfile.gettempdir()) / f"paraflow-{os.getuid()}"


# ---------------------------------------------------------------- reading records
def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def fault_signal(directory: Path, rank: int) -> Optional[str]:
    """The fatal signal faulthandler recorded for `rank` ("SIGABRT", ...; "SIGTERM" for the stacks it
    writes when the launcher ends the rank), or None."""
    try:
        text = (Path(directory) / f"rank{rank}.fault").read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r"Fatal Python error: ([A-Za-z -]+)", text)
    if not match:
        return "SIGTERM" if text.strip() else None
    return _SIGNALS.get(match.group(1).strip(), match.group(1).strip())


def _process_start() -> float:
    """When this process started (wall time; 0 where /proc does not say)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        lines = Path("/proc/stat").read_text().splitlines()
        boot = next(int(line.split()[1]) for line in lines if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0
    return boot + ticks / os.sysconf("SC_CLK_TCK") - 1.0  # btime is whole seconds


def _records(directory: Path) -> dict[int, dict]:
    """The records in `directory`; seen from a rank, only those of its own job: a directory named
    after a launcher's job id (torchrun's default port) may hold an earlier job's, made before this
    process started, while every rank of this job writes its own after the rendezvous."""
    since = _started if _current is not None else 0.0
    found = {}
    for path in Path(directory).glob("rank*.rec"):
        record = read_record(path)
        if record is not None and record["started"] >= since:
            found[record["rank"]] = record
    return found


def describe(record: dict) -> str:
    """Where a rank was, from its record: the phase, call site, step and last collective."""
    call, site, number = record["call"], record["site"], record["number"]
    collective = f"{record['collective']} as collective #{number}"
    if call in COLLECTIVES:
        return f"in {collective} at {site}"
    if call == "idle":
        return f"in its own code after {record['after']} (last paraflow line {site}, {number} collectives made)"
    if call == "backward":
        where = f"in backward's gradient reduction (or the optimizer step) after the forward at {site}"
        where += f" (step {record['step']})"
    elif call.startswith("forward"):
        where = f"in the {call} at {site} (step {record['step']})"
    else:
        where = f"in {call} at {site}"
    if record["inside"] and record["inner"]:
        return f"{where}, in {collective} ({record['inner']})"
    if number:
        return f"{where}, after {collective}" + (f" ({record['inner']})" if record["inner"] else "")
    return where


def _position(record: dict) -> tuple:
    return (record["call"], record["collective"], record["number"], record["inner"], record["inside"])


def compose(dead: dict, signal_name: Optional[str], others: dict[int, dict], directory: Path) -> str:
    """The one line for a rank that died: its phase and, for every other rank with a record, where it was."""
    rank, world = dead["rank"], dead["world_size"]
    how = f"died ({signal_name})" if signal_name else "died without a fault report (SIGKILL, os._exit, the OOM killer)"
    text = f"paraflow: rank {rank} of {world} {how} {describe(dead)}"
    parts = []
    for r, record in sorted(others.items()):
        if r == rank:
            continue
        elsewhere = "elsewhere: " if _position(record) != _position(dead) else ""
        gone = not record["ended"] and not _alive(record["pid"])
        state = f" (then ended: {fault_signal(directory, r) or 'no fault report'})" if gone else ""
        parts.append(f"rank {r} was {elsewhere}{describe(record)}{state}")
    if parts:
        text += "; " + "; ".join(parts)
    missing = [r for r in range(world) if r not in others and r != rank]
    if missing:
        text += f"; no record of {ranks_text(missing)} on this host"
    if signal_name:
        text += f". Its Python stacks: {Path(directory) / f'rank{rank}.fault'}"
    return text + "."


def dead_ranks(directory: Path) -> list[int]:
    """Ranks of `directory` whose process is gone without passing through Python's exit."""
    return sorted(r for r, rec in _records(directory).items() if not rec["ended"] and not _alive(rec["pid"]))


def _died(directory: Path, records: dict[int, dict]) -> Iterator[tuple[int, Optional[str]]]:
    """The ranks of `records` that died, in order, with their fault report's signal: gone without
    passing through Python's exit, and not ended by the launcher (SIGTERM)."""
    for rank in sorted(records):
        record = records[rank]
        if record["ended"] or _alive(record["pid"]):
            continue
        signal_name = fault_signal(directory, rank)
        if signal_name != "SIGTERM":
            yield rank, signal_name


def dead_peers_text(directory: Optional[Path] = None) -> str:
    """The last-words lines of every dead rank recorded in `directory` (this job's by default), or ''."""
    directory = job_directory() if directory is None else directory
    records = _records(directory)
    lines = [compose(records[r], signal_name, records, directory) for r, signal_name in _died(directory, records)]
    return " ".join(lines)


def report_dead_ranks(
    directory: Path, file: Any = None, once: bool = True, settle: float = 0.0, in_collectives: bool = False
) -> list[int]:
    """Print the line of each dead rank of `directory` on `file` (stderr); with `once`, only the
    first caller in the job prints a given rank's line. Returns the ranks printed.

    `settle`: seconds to wait for ranks that are dying (faulthandler has written their fault file,
    the process is not gone yet), so that a rank leaving on an error it got from a dying peer reports it;
    with `in_collectives`, also for other ranks still inside a collective: a mismatched collective can
    hand this rank a wrong result a moment before the library aborts the peer that made it.
    """
    deadline = time.monotonic() + settle

    def dying(rank: int, record: dict) -> bool:
        if record["ended"] or record["pid"] == os.getpid() or not _alive(record["pid"]):
            return False
        return bool(fault_signal(directory, rank)) or (in_collectives and record["inside"])

    while time.monotonic() < deadline and any(dying(r, rec) for r, rec in _records(directory).items()):
        time.sleep(0.05)
    records = _records(directory)
    printed = []
    for rank, signal_name in _died(directory, records):
        record = records[rank]
        if once:
            try:
                marker = Path(directory) / f"rank{rank}-{record['pid']}.reported"
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except OSError:
                continue
        line = compose(record, signal_name, records, directory)
        out = sys.stderr if file is None else file
        # On its own line even when the library's thread is halfway through one of its own (horovod
        # writes its log lines in pieces), at the cost of a blank line otherwise.
        out.write("\n" + line + "\n")
        out.flush()
        printed.append(rank)
    return printed


class LastWordsWatch:
    """A thread that waits on the other local ranks' processes and reports the one that dies."""

    def __init__(self, directory: Path, rank: int, local_peers: int) -> None:
        self.directory, self.rank, self.local_peers = directory, rank, local_peers
        self._wake_r, self._wake_w = os.pipe()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="paraflow last words", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread."""
        self._stop.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _run(self) -> None:
        watched: dict[int, int] = {}  # pidfd -> rank
        seen: set = set()
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        try:
            while not self._stop.is_set():
                if len(seen) < self.local_peers:
                    for rank, record in _records(self.directory).items():
                        if rank == self.rank or rank in seen:
                            continue
                        seen.add(rank)
                        try:
                            fd = os.pidfd_open(record["pid"])
                        except OSError:  # gone already
                            report_dead_ranks(self.directory)
                            continue
                        watched[fd] = rank
                        poller.register(fd, select.POLLIN)
                timeout = None if len(seen) >= self.local_peers else 1000
                for fd, _ in poller.poll(timeout):
                    if fd in watched:
                        poller.unregister(fd)
                        os.close(fd)
                        del watched[fd]
                        if not self._stop.is_set():
                            report_dead_ranks(self.directory)
        except Exception:  # noqa: BLE001 - the last words are a courtesy; training goes on without them
            pass
        finally:
            for fd in watched:
                os.close(fd)


_current: Optional[RecordedActivity] = None  # this process's record, for mark_ended
_started = 0.0  # when this process started, for _records


def start_last_words(backend: Any) -> tuple[Optional[RecordedActivity], Optional[LastWordsWatch]]:
    """For a job of several processes: this rank's recorded activity and the watch over its local
    peers, or (None, None) when the job directory cannot be written (the stall watch's plain record then)."""
    global _current, _started
    _started = _process_start()
    directory = job_directory()
    try:
        if backend.local_rank == 0:
            prune(_base())
        last_words = LastWords(directory, backend.rank, backend.world_size)
    except OSError:
        return None, None
    activity = _current = RecordedActivity(last_words)
    atexit.register(mark_ended)
    watch = None
    if backend.local_world_size > 1 and hasattr(os, "pidfd_open"):
        watch = LastWordsWatch(last_words.directory, backend.rank, backend.local_world_size - 1)
        watch.start()
    return activity, watch


def mark_ended() -> None:
    """Record that this process leaves through Python (an error's exit, MPI_Abort after a traceback):
    the other ranks then do not report it as died. Called at exit and before MPI_Abort."""
    activity = _current
    if activity is not None and not activity.ended:
        activity.ended = True
        activity.last_words.ended()


def end_last_words(activity: Optional[Activity], watch: Optional[LastWordsWatch], clean: bool) -> None:
    """At shutdown: stop the watch, mark the record ended and, after a clean end, remove its files."""
    global _current
    if watch is not None:
        watch.stop()
    if isinstance(activity, RecordedActivity):
        activity.ended = True
        activity.last_words.ended()
        if clean:
            activity.last_words.close()
            if _current is activity:
                _current = None


def new_job_directory() -> Path:
    """A fresh job directory for a launch paraflow starts (``paraflow run``, ``paraflow.launch``): its
    ranks get it as ``PARAFLOW_JOB_DIR``."""
    base = _base()
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="job-launch-", dir=base))


def job_ended(directory: Path, dead: Optional[list] = None) -> None:
    """After a launch: print the line of every rank of `directory` that died (the job's last words;
    `dead`: they were printed already), then remove the directory unless one of them left a fault
    report (its Python stacks stay for the user)."""
    if dead is None:
        dead = report_dead_ranks(directory, once=False)
    if not any(fault_signal(directory, rank) for rank in dead):
        shutil.rmtree(directory, ignore_errors=True)


#: Job directories older than this, whose ranks are all gone, are removed when a job starts.
STALE_S = 24 * 3600.0


def prune(base: Path) -> None:
    """Remove paraflow's job directories under `base` (its own folder in the temporary directory) left
    by jobs that ended a day ago or more (a crash keeps its records for the user to read)."""
    try:
        entries = list(base.iterdir())
    except OSError:
        return
    now = time.time()
    for entry in entries:
        try:
            if not entry.name.startswith("job-") or now - entry.stat().st_mtime < STALE_S:
                continue
            if any(_alive(rec["pid"]) for rec in _records(entry).values()):
                continue
            for path in entry.glob("rank*"):
                if path.suffix in (".rec", ".fault", ".reported"):
                    path.unlink()
            entry.rmdir()  # fails, and keeps it, when anything else is inside
        except OSError:
            continue
