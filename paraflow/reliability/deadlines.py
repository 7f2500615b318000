"""Bounded waits for calls and libraries that have no timeout of their own.

The last of them, the watchdog, is for waits that cannot be interrupted at all: a thread that
ends the process when one outlives its deadline. Horovod waits for a handle in C++
(``hvd.synchronize``, inside ``broadcast_parameters``, ``broadcast_optimizer_state``,
``barrier``, ``join`` and ``DistributedOptimizer.step``), and under its MPI controller that wait
has no timeout: a rank that stops answering leaves the others' background thread blocked in an
MPI call and their main thread waiting for good. Polling the handle from Python would bound it,
at a price on every training step. The watchdog costs nothing while waits end in time: entering
a watched wait stores its deadline in a dict, leaving removes it, and a daemon thread looks at
the dict twice a second. Only a wait past its deadline makes it act: it prints the error that
wait would have raised, then ends the process (MPI_Abort under MPI, so the launcher takes the
whole job down), since the waiting thread cannot be woken.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from typing import Callable, Optional, TypeVar

from .mpi_abort import end_job

__all__ = ["DeadlineExceeded", "call_with_deadline", "spin_until", "Watchdog", "watchdog"]

_T = TypeVar("_T")


class DeadlineExceeded(RuntimeError):
    """A blocking call that did not return in time (its message says "timed out")."""


def call_with_deadline(fn: Callable[[], _T], seconds: float, what: str) -> _T:
    """Run `fn` in a helper thread and return its result, or raise once `seconds` have passed.

    For calls that can block without a timeout of their own (a rendezvous client talking to a
    port that another program holds). On expiry the thread is left blocked as a daemon; the
    caller is expected to fail.
    """
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=f"paraflow {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise DeadlineExceeded(f"{what} timed out after {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def spin_until(done: Callable[[], bool], seconds: float, what: str, sleep: bool = False) -> None:
    """Poll `done`, yielding the core (and the GIL) between polls, until it is true; fail once
    `seconds` have passed. With `sleep`, sleep between polls instead, backing off from 10 µs to 0.2 ms.

    For a library whose own wait spins the same way but has no timeout (horovod's
    ``synchronize``, under either controller): the wait costs what the library's does and
    notices completion at once. Waiting on a thread of its own, with the caller on an event,
    costs a thread hand-off per call, and sleeping between polls notices completion late.

    Raises:
        DeadlineExceeded: "`what` timed out after `seconds` s".
    """
    deadline = time.monotonic() + seconds
    now, pause = time.monotonic, 1e-5
    while not done():
        if now() > deadline:
            raise DeadlineExceeded(f"{what} timed out after {seconds:g} s")
        if not sleep:
            os.sched_yield()
            continue
        time.sleep(pause)
        pause = min(2 * pause, 2e-4)


#: Seconds between the watchdog's looks at the waits in progress (how late it may act).
TICK_S = 0.5


class _Watch:
    """A wait: registered on each entry, removed on exit; entered again for every wait it bounds
    (horovod's optimizer makes one and enters it on every step)."""

    __slots__ = ("_dog", "_key", "_deadline", "_report")

    def __init__(self, dog: Watchdog, seconds: float, report: Callable[[float], str]) -> None:
        self._dog, self._deadline, self._report = dog, seconds, report

    def __enter__(self) -> None:
        self._key = next(self._dog._keys)
        start = time.monotonic()
        self._dog._waits[self._key] = (start + self._deadline, start, self._report)
        self._dog._ensure_running()

    def __exit__(self, *exc) -> None:
        self._dog._waits.pop(self._key, None)


class Watchdog:
    """Ends the process when a watched wait outlives its deadline; one per process (:data:`watchdog`)."""

    def __init__(self, end: Callable[[int], None] = end_job) -> None:
        self._waits: dict = {}
        self._keys = itertools.count()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._end = end

    def watch(self, seconds: float, report: Callable[[float], str]) -> _Watch:
        """Context manager around a wait that must end within `seconds`.

        Args:
            seconds: the deadline, from entering the context.
            report: called with the seconds waited when the deadline passes; returns the text
                printed (the error, as ``Type: message``) before the process ends.
        """
        return _Watch(self, seconds, report)

    def _ensure_running(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="paraflow watchdog", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(TICK_S)
            now = time.monotonic()
            for deadline, start, report in list(self._waits.values()):
                if now >= deadline:
                    self._expire(report, now - start)

    def _expire(self, report: Callable[[float], str], waited: float) -> None:
        try:
            text = report(waited)
        except Exception as exc:  # noqa: BLE001 - the process must end anyway
            text = f"a wait outlived its deadline ({exc!r} while describing it)"
        sys.stderr.write(f"{text}\n")
        sys.stderr.flush()
        sys.stdout.flush()
        self._end(1)


#: The process's watchdog.
watchdog = Watchdog()
