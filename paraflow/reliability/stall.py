"""The stall report: when ranks wait on each other too long, every rank says who waits on what.

Horovod's stall inspector, for every backend. Each rank records what it is doing in-process
(:mod:`paraflow.reliability.activity`: the paraflow call or training phase, its call site and
step); nothing crosses the network while training is healthy. A watchdog thread per rank wakes
every ``threshold / 4`` seconds (7.5 s by default) and makes one round trip to a key-value store
every rank reaches without a collective (:func:`process_group_store`, else :func:`hosted_store`).
When this rank has waited longer than the threshold (default 30 s, ``stall_threshold=`` or
``PARAFLOW_STALL_THRESHOLD``, at most half the timeout; 0 turns it off), it opens a *round* in the
store; every rank's watchdog sees it on its next wake, writes its own record, reads everyone's,
and prints one report on stderr starting ``paraflow stall:``: each rank's phase, call site, step
and wait, the ranks that sent nothing, and the likely fix. A timeout error raised afterwards
carries the same facts (:func:`stall_facts`).
"""

from __future__ import annotations

import atexit
import datetime
import json
import socket
import sys
import threading
import time
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from .activity import Activity, State, ranks_text
from .collective_check import call_text

__all__ = [
    "STALL_ENV",
    "DEFAULT_STALL_S",
    "StallWatch",
    "start_stall_watch",
    "stall_facts",
    "compose_report",
]

#: The variable and the default of the threshold (``stall_threshold=``); 0 turns the report off.
STALL_ENV = "PARAFLOW_STALL_THRESHOLD"
DEFAULT_STALL_S = 30.0


def start_stall_watch(
    backend: Any, activity: Optional[Activity] = None
) -> tuple[Optional[Activity], Optional[StallWatch]]:
    """A multi-process backend's activity record (`activity`, or a new one) and, unless turned off,
    its running watchdog."""
    if backend.world_size == 1:
        return None, None
    activity = activity or Activity()
    if backend.stall_threshold <= 0:
        return activity, None
    opener = process_group_store() or hosted_store(backend)
    if opener is None:
        if backend.rank == 0:
            print("paraflow: no store the ranks share, so no stall reports in this job", file=sys.stderr, flush=True)
        return activity, None
    watch = StallWatch(backend, activity, opener)
    watch.start()
    return activity, watch


def stall_facts(backend: Any) -> str:
    """The last stall report of `backend`, as a sentence to append to an error ('' if none)."""
    watch = getattr(backend, "_stall", None)
    report = getattr(watch, "last_report", None)
    if not report:
        return ""
    lines = [line for line in report.splitlines() if "The job fails when" not in line]
    return " Stall report before this error: " + " ".join(" ".join(lines).split())


class StallWatch:
    """One rank's watchdog thread (see the module docstring)."""

    def __init__(self, backend: Any, activity: Activity, open_store: Callable[[], Any]) -> None:
        self.rank, self.world_size = backend.rank, backend.world_size
        self.name, self.timeout = backend.name, backend.timeout
        # A report after the timeout would come too late to help: at most half of it.
        self.threshold = min(backend.stall_threshold, backend.timeout / 2)
        self.interval = max(0.5, min(self.threshold / 4, 10.0))
        self.window = self.interval + 5.0  # every rank answers within one wake, plus slack for a loaded host
        self.activity = activity
        self.last_report: Optional[str] = None
        self._open_store = open_store
        self._answered = 0
        self._covered: Optional[State] = None  # the wait the last round already reported
        self._printed_at: Optional[float] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="paraflow stall watch", daemon=True)

    def start(self) -> None:
        """Start the thread; it is stopped at exit too, for a script that never shuts the backend down."""
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        """Stop the thread, waiting for the store operation it may be in (bounded by that operation's timeout).

        The thread must not outlive this wait: a daemon thread still inside torch's store (C++, the
        GIL released) when the interpreter exits is ended as it takes the GIL back, inside a C++
        destructor, and the process aborts ("terminate called without an active exception") after
        a run that did all its work.
        """
        self._stop.set()
        atexit.unregister(self.stop)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=STORE_OP_TIMEOUT_S + 5.0)

    # ---------------------------------------------------------------- the thread
    def _run(self) -> None:
        store = None
        while not self._stop.wait(self.interval):
            try:
                if store is None:
                    store = self._open_store()
                self._tick(store)
            except Exception:  # noqa: BLE001 - rank 0 (the store) gone or busy: try again next wake
                store = None

    def _tick(self, store: Any) -> None:
        asked = store.add("round", 0)
        if asked > self._answered:
            if self._printed_at is not None and time.monotonic() - self._printed_at < self.threshold:
                self._publish(store, asked)  # a round opened by a rank that has not seen ours yet
            else:
                self._report(store, asked)
            return
        state = self.activity.state
        if state.waits and state is not self._covered and time.monotonic() - state.since >= self.threshold:
            self._report(store, store.add("round", 1))

    def _publish(self, store: Any, round_: int) -> None:
        """Write this rank's record, marked with the newest round it has seen."""
        self._answered = max(self._answered, round_)
        state = self.activity.state
        if state.waits:
            self._covered = state  # this wait is in a report now: it opens no round of its own
        store.set(f"record/{self.rank}", json.dumps({**self._record(state), "round": self._answered}))

    def _report(self, store: Any, round_: int) -> None:
        self._publish(store, round_)
        records = self._collect(store, round_)
        self.last_report = compose_report(
            rank=self.rank,
            world_size=self.world_size,
            records=records,
            threshold=self.threshold,
            timeout=self.timeout,
            window=self.window,
        )
        self._printed_at = time.monotonic()
        print(self.last_report, file=sys.stderr, flush=True)

    def _record(self, state: State) -> dict:
        return {
            "call": state.call,
            "site": state.site,
            "detail": _detail(state),
            "step": state.step,
            "after": state.after,
            "waits": state.waits,
            "for": round(time.monotonic() - state.since, 1),
            "passes": self.activity.passes,
        }

    def _collect(self, store: Any, round_: int) -> dict[int, dict]:
        """Every rank's record written for this round or a later one, waiting up to the window.

        Two ranks may open rounds at the same moment; each keeps its own record current with the
        newest round while it waits, so both collections complete.
        """
        keys = [f"record/{r}" for r in range(self.world_size)]
        deadline = time.monotonic() + self.window
        while True:
            latest = store.add("round", 0)
            if latest > self._answered:
                self._publish(store, latest)
            present = keys if store.check(keys) else [k for k in keys if store.check([k])]
            values = store.multi_get(present) if present else []
            records = {int(k.rpartition("/")[2]): json.loads(bytes(v).decode()) for k, v in zip(present, values)}
            fresh = {r: rec for r, rec in records.items() if rec["round"] >= round_}
            if len(fresh) == self.world_size or time.monotonic() >= deadline or self._stop.is_set():
                return fresh
            time.sleep(0.25)


def _detail(state: State) -> str:
    """A collective's full description (its number, tensor, op or source and call site), else ''."""
    if state.call_args is None:
        return ""
    number, tensor, argument = state.call_args
    return call_text(state.call, number, tensor, argument, state.site)


# ---------------------------------------------------------------- where the reports meet
# torch.distributed backends: the process group's own rendezvous store (torchrun's agent store, or
# the one rank 0 serves for ``tcp://``), through a connection of the watchdog's own
# (``Store.clone``), so it never queues behind the main thread. Others (horovod under mpirun or
# horovodrun has no torch store): rank 0 serves a small torch ``TCPStore`` on a free port, and the
# address reaches the other ranks once, at ``init``, through the backend's own broadcast. Either
# way an *opener* is returned, called in the watchdog's thread on its first wake, so connecting
# costs the main thread nothing.

#: Seconds one store operation of the watchdog may block (rank 0 gone: give up, try later).
STORE_OP_TIMEOUT_S = 10.0
_ADDRESS_BYTES = 256  # a host name and a port
_sessions = 0  # backends started in this process: keys of an earlier session never mix in


def _prefix() -> str:
    global _sessions
    _sessions += 1
    return f"paraflow/stall/{_sessions}/"


def process_group_store() -> Optional[Callable[[], Any]]:
    """An opener for a clone of torch.distributed's default store, or None without one."""
    base = dist.distributed_c10d._get_default_store() if dist.is_initialized() else None
    if base is None or not hasattr(base, "clone"):
        return None
    prefix = _prefix()

    def connect() -> Any:
        store = base.clone()
        store.set_timeout(datetime.timedelta(seconds=STORE_OP_TIMEOUT_S))
        return dist.PrefixStore(prefix, store)

    return connect


def hosted_store(backend: Any) -> Optional[Callable[[], Any]]:
    """Rank 0 serves a TCPStore; its address reaches every rank through one broadcast (a collective call).

    Returns None on every rank when rank 0 could not open one.
    """
    prefix = _prefix()
    server, address = None, None
    timeout = datetime.timedelta(seconds=STORE_OP_TIMEOUT_S)
    if backend.rank == 0:
        host = "127.0.0.1" if backend.local_world_size == backend.world_size else socket.gethostname()
        try:
            server = dist.TCPStore(host, 0, backend.world_size, True, timeout=timeout, wait_for_workers=False)
            address = (host, server.port)
        except Exception:  # noqa: BLE001 - no store, no stall reports; training goes on
            address = None
    address = _broadcast_address(backend, address)
    if address is None:
        return None

    def connect() -> Any:
        store = server or dist.TCPStore(
            address[0], address[1], backend.world_size, False, timeout=timeout, wait_for_workers=False
        )
        return dist.PrefixStore(prefix, store)

    return connect


def _broadcast_address(backend: Any, address: Optional[tuple]) -> Optional[tuple]:
    """Rank 0's (host, port), or None, on every rank: one broadcast of a fixed-size byte tensor."""
    raw = torch.zeros(_ADDRESS_BYTES, dtype=torch.uint8)
    if address is not None:
        text = f"{address[0]}:{address[1]}".encode()
        raw[: len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    text = bytes(backend.broadcast(raw, src=0).tolist()).rstrip(b"\0").decode()
    if not text:
        return None
    host, _, port = text.rpartition(":")
    return host, int(port)


# ---------------------------------------------------------------- the report
# A record (written by StallWatch._record) holds a rank's phase (``call``: a paraflow call,
# ``forward``, ``backward``, ``optimizer.step`` or ``idle`` with the phase it left in ``after``),
# its call site, step, seconds in that phase, whether that phase waits on other ranks, and how
# many data passes of paraflow's sampler it has begun.
#: Paraflow calls every rank must make together.
COLLECTIVE_CALLS = ("allreduce", "broadcast", "allgather", "barrier", "save", "load", "export")
_TRAINING = ("forward", "backward", "optimizer.step", "idle")


def _doing(record: dict) -> str:
    call, site, seconds = record["call"], record["site"], record["for"]
    if call == "idle":
        return f"running its own code for {seconds:.0f} s, since {record['after']} returned (last paraflow line {site})"
    if call == "backward":
        what = f"in backward or the optimizer step after the forward at {site}"
    else:
        what = f"in {record.get('detail') or f'{call} at {site}'}"
    return what + (f", waiting {seconds:.0f} s" if record["waits"] else f" for {seconds:.0f} s")


def _short(record: dict) -> str:
    if record["call"] == "idle":
        what = f"own code after {record['after']}"
    else:
        what = record.get("detail") or f"{record['call']} at {record['site']}"
    return f"{what}, step {record['step']}"


def _line(ranks: list[int], record: dict) -> str:
    return f"  {ranks_text(ranks)}: {_doing(record)} (step {record['step']})"


def likely_causes(records: dict[int, dict], world_size: int, window: float) -> list[str]:
    """The likely explanations of a stall, most specific first.

    Args:
        records: rank -> its record, for the ranks that answered.
        world_size: number of ranks in the job.
        window: seconds the ranks had to answer.
    """
    causes = []
    missing = [r for r in range(world_size) if r not in records]
    if missing:
        causes.append(
            f"{ranks_text(missing)} sent no record within {window:.0f} s: stopped (SIGSTOP, a debugger), crashed or "
            "exited, or stuck in native code that holds the Python GIL; its own output or the launcher's says which."
        )
    if _different_collectives(records):
        causes.append(
            "the ranks wait in different collectives ("
            + "; ".join(f"rank {r}: {rec['detail']}" for r, rec in sorted(records.items()))
            + "): every rank must make the same collectives in the same order, with tensors of the same shape "
            "and dtype and the same op or source. A loop over uneven shards (an evaluation where one rank has "
            "more batches) does this: give every rank the same number of batches, or reduce once after the loop. "
            "PARAFLOW_DEBUG=1 (or paraflow.init(check_collectives=True)) makes it an error at the call."
        )
        return causes
    for call in COLLECTIVE_CALLS:
        inside = sorted(r for r, rec in records.items() if rec["call"] == call)
        outside = sorted(r for r, rec in records.items() if rec["call"] != call)
        if inside and outside:
            causes.append(_collective_cause(call, inside, outside, records))
    idle = sorted(r for r, rec in records.items() if rec["call"] == "idle")
    if not causes and idle and len(idle) < len(records):
        causes.append(
            f"{ranks_text(idle)} {'is' if len(idle) == 1 else 'are'} in the script's own code, in no paraflow call or "
            f"training step, while the others wait: either work only some ranks do (an evaluation, logging or a "
            f"torch.save under `if rank == 0:`: make it short, or have every rank take part), or "
            f"{'it has' if len(idle) == 1 else 'they have'} left the training loop early. " + _UNEVEN_FIX
        )
    if not causes and len({rec["step"] for rec in records.values()}) > 1:
        steps = ", ".join(f"rank {r} at step {rec['step']}" for r, rec in sorted(records.items()))
        causes.append(
            f"the ranks are at different training steps ({steps}): they ran different numbers of batches. "
            + _UNEVEN_FIX
        )
    if not causes:
        causes.append(
            "every rank is in the same phase at the same step: one is slow inside it (I/O, a long computation) or "
            "the network is stuck. If the wait is legitimate, raise the threshold (stall_threshold=SECONDS, "
            "PARAFLOW_STALL_THRESHOLD) or the timeout (timeout=SECONDS, PARAFLOW_TIMEOUT)."
        )
    return causes


def _different_collectives(records: dict[int, dict]) -> bool:
    """True when every rank is inside a public collective but not all in the same one."""
    details = {rec.get("detail") for rec in records.values()}
    return len(details) > 1 and all(details) and len({_call_only(d) for d in details}) > 1


def _call_only(detail: str) -> str:
    """A collective's description without its call site: ranks calling from different lines is fine."""
    return detail.rpartition(" at ")[0]


_UNEVEN_FIX = (
    "Uneven batch counts per epoch: train the epoch under `with backend.join(model, optimizer):`, or give every "
    "rank the same number of batches (backend.distributed_sampler(..., drop_last=True))."
)


def _collective_cause(call: str, inside: list[int], outside: list[int], records: dict[int, dict]) -> str:
    site = records[inside[0]]["site"]
    writes = " (it writes from rank 0 alone)" if call == "save" else ""
    elsewhere = "; ".join(f"rank {r}: {_short(records[r])}" for r in outside[:4]) + (
        "; ..." if len(outside) > 4 else ""
    )
    text = (
        f"{call} is collective: every rank must call it{writes}. {ranks_text(inside)} called it at {site}; "
        f"{ranks_text(outside)} did not and went on ({elsewhere}). A call under `if rank == 0:` (or any branch only "
        f"some ranks take) waits for ranks that never come: call it on every rank."
    )
    ahead = all(records[r]["passes"] > max(records[i]["passes"] for i in inside) for r in outside)
    training = all(records[r]["call"] in _TRAINING for r in outside)
    if training and not ahead:
        text += f" Or {ranks_text(inside)} ran out of batches first. " + _UNEVEN_FIX
    return text


def compose_report(
    *, rank: int, world_size: int, records: dict[int, dict], threshold: float, timeout: float, window: float
) -> str:
    """The report one rank prints: a header, one line per group of ranks doing the same, the causes."""
    groups: dict[tuple, list[int]] = {}
    for r, rec in sorted(records.items()):
        groups.setdefault(
            (rec["call"], rec["site"], rec.get("detail"), rec["step"], rec["after"], rec["waits"]), []
        ).append(r)
    longest: Optional[float] = max((rec["for"] for rec in records.values() if rec["waits"]), default=None)
    waited = f"a rank has waited {longest:.0f} s" if longest is not None else "a wait passed the threshold"
    lines = [f"paraflow stall: seen from rank {rank} of {world_size}: {waited} (threshold {threshold:g} s). Each rank:"]
    for ranks in groups.values():
        worst = max(ranks, key=lambda r: records[r]["for"])
        lines.append(_line(ranks, records[worst]))
    missing = [r for r in range(world_size) if r not in records]
    if missing:
        lines.append(f"  {ranks_text(missing)}: no record")
    lines += [f"  likely cause: {cause}" for cause in likely_causes(records, world_size, window)]
    lines.append(
        f"  The job fails when the timeout of {timeout:g} s runs out (paraflow.init(timeout=...), PARAFLOW_TIMEOUT)."
    )
    return "\n".join(lines)
