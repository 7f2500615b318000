"""Blocking waits run on a thread of their own, so the caller can give up after a timeout.

Some libraries' waits have no timeout (a horovod handle under the MPI controller). Polling such
a handle from Python with sleeps noticed completion late and took the core from the library's
own thread: a 1 MB horovod allreduce through paraflow cost twice the raw call. Here one daemon
thread blocks in the library's wait, which wakes the moment the work is done, and the caller
blocks on an event with the timeout: no polling, and on expiry the caller raises while the
thread stays behind (the job is broken then; the caller's backend must not wait on it again).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Optional

from .deadlines import DeadlineExceeded

__all__ = ["Waiter"]

#: How long close() waits for an idle thread to end (it ends at once).
_JOIN_S = 5.0


class _Job:
    __slots__ = ("fn", "done", "value", "error")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.value: Any = None
        self.error: Optional[BaseException] = None


class Waiter:
    """One daemon thread, started on first use, that runs blocking waits in the order given."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None

    def run(self, fn: Callable[[], Any], seconds: float, what: str) -> Any:
        """`fn()`'s result, or DeadlineExceeded ("`what` timed out after `seconds` s") once they pass."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()
        job = _Job(fn)
        self._jobs.put(job)
        if not job.done.wait(seconds):
            raise DeadlineExceeded(f"{what} timed out after {seconds:g} s")
        if job.error is not None:
            raise job.error
        return job.value

    def close(self) -> None:
        """End the thread once the waits given before are done, and wait for that unless one of
        them is stuck (then the thread stays, as a daemon). A thread still running at interpreter
        exit that frees a tensor there aborts the process ("terminate called without an active
        exception"), so an idle one is joined."""
        if self._thread is not None:
            self._jobs.put(None)
            if self._idle:
                self._thread.join(timeout=_JOIN_S)
            self._thread = None

    _idle = True  # no wait given to the thread is unfinished

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._idle = False
            try:
                job.value = job.fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                job.error = exc
            finally:
                job.fn = None
            self._idle = True
            done = job.done
            del job  # hold no result while blocked: the caller frees it
            done.set()
