"""The stall report: when ranks wait on each other too long, every rank says who waits on what.

Horovod's stall inspector, for every backend. Each rank records what it is doing in-process
(:mod:`paraflow.reliability.activity`: the paraflow call or training phase, its call site and
step); nothing crosses the network while training is healthy. A watchdog thread per rank wakes
every ``threshold / 4`` seconds (7.5 s by default) and makes one round trip to a key-value store
(:mod:`paraflow.reliability.stall_store`). When this rank has waited longer than the threshold
(default 30 s, ``stall_threshold=`` or ``PARAFLOW_STALL_THRESHOLD``, at most half the timeout;
0 turns it off), it opens a *round* in the store; every rank's watchdog sees it on its next
wake, writes its own record, reads everyone's, and prints one report on stderr starting
``paraflow stall:``: each rank's phase, call site, step and wait, the ranks that sent nothing,
and the likely fix. A timeout error raised afterwards carries the same facts (:func:`stall_facts`).
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Optional

from ..errors import ConfigurationError
from .activity import Activity, State, site_text
from .collective_check import call_text
from .stall_explain import compose_report

__all__ = ["STALL_ENV", "DEFAULT_STALL_S", "StallWatch", "start_stall_watch", "stall_facts", "stall_threshold_seconds"]

STALL_ENV = "PARAFLOW_STALL_THRESHOLD"
DEFAULT_STALL_S = 30.0
_watches: list = []  # running watches of this process, for the exception hook


def stall_threshold_seconds(value: Any) -> float:
    """Seconds from `value`, else PARAFLOW_STALL_THRESHOLD, else 30; 0 turns the report off."""
    source = "stall_threshold"
    if value is None:
        if not os.environ.get(STALL_ENV):
            return DEFAULT_STALL_S
        value, source = os.environ[STALL_ENV], STALL_ENV
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigurationError(
            f"{source}={value!r} is not a number of seconds >= 0; set it to e.g. 30 (the default), "
            "or 0 to turn the stall report off."
        )
    return seconds


def start_stall_watch(backend: Any) -> tuple[Optional[Activity], Optional[StallWatch]]:
    """A multi-process backend's activity record and, unless turned off, its running watchdog."""
    if backend.world_size == 1:
        return None, None
    activity = Activity()
    if backend.stall_threshold <= 0:
        return activity, None
    opener = backend._stall_store()
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
        """Start the thread and make uncaught errors repeat the last report."""
        _install_excepthook()
        _watches.append(self)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (at most one store operation's wait)."""
        self._stop.set()
        if self in _watches:
            _watches.remove(self)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

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
            "site": site_text(state.site),
            "detail": _detail(state),
            "step": state.step,
            "after": state.after,
            "waits": state.waits,
            "for": round(time.monotonic() - state.since, 1),
            "passes": self.activity.passes,
            "host": socket.gethostname(),
            "pid": os.getpid(),
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
    return call_text(state.call, number, tensor, argument, site_text(state.site))


def _install_excepthook() -> None:
    """An uncaught error (torch's own, from inside ``loss.backward()``) is followed by the last report."""
    previous = sys.excepthook
    if getattr(previous, "paraflow_stall_facts", False):
        return

    def excepthook(kind, value, traceback) -> None:
        previous(kind, value, traceback)
        reports = [w.last_report for w in _watches if w.last_report]
        if reports and "paraflow stall" not in str(value):
            print(f"{reports[-1]}\n(the last stall report before this error)", file=sys.stderr, flush=True)

    excepthook.paraflow_stall_facts = True
    sys.excepthook = excepthook
