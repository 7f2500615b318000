"""Measure directly how much of a step is paraflow's own code, independent of step-to-step noise.

Three numbers per step:

- own Python: the time the innermost running frame is a function of paraflow's library
  (paraflow/ without bench/ and examples/) and not inside a call into C, measured with a
  ``sys.setprofile`` hook that charges each interval to whoever held it (the hook's own work is
  not charged). Calls from paraflow's code into torch or horovod are excluded. It is counted
  apart inside bounded waits (below): there it runs while the library works, not after it.
- late waiting: for every bounded wait (``paraflow.reliability.deadlines.wait_until``, which polls
  a library handle with sleeps), the time between the last poll that found the work unfinished
  and the poll that found it done: an upper bound on how long after the library finished
  paraflow noticed. Half of it is the expected delay when finishing times fall anywhere in between.

The hook itself is not charged, but the interpreter's work to call it (between the hook's
return and the next event) lands on the frame that runs: a few tenths of a microsecond per event,
which a stack walk of C calls multiplies. `dispatch_cost` measures that per charged interval on a
pure-Python probe (profiled time minus unprofiled time, over its intervals) and
`profile_own_code` subtracts it, so own Python is not inflated by being observed.

Own Python outside waits is what paraflow surely adds to a step; plus late waiting, what it adds
at most by itself. The CPU its polling takes from the library meanwhile (own Python inside waits,
reported) shows only in the paired comparison.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Optional

__all__ = ["profile_own_code", "is_own_file", "OwnTime", "instrument_waits", "dispatch_cost"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # paraflow/
_NOT_OWN = tuple(os.path.join(_PACKAGE, d) + os.sep for d in ("bench", "examples"))


def is_own_file(filename: str) -> bool:
    """True for a source file of paraflow's library (its benchmark and examples excluded)."""
    return filename.startswith(_PACKAGE + os.sep) and not filename.startswith(_NOT_OWN)


class OwnTime:
    """A profile hook adding up the time paraflow's own Python frames run (`clock`: seconds)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, own_codes: frozenset = frozenset()) -> None:
        self.clock = clock
        self.total = 0.0  # outside bounded waits
        self.intervals = 0  # how many intervals `total` adds up
        self.waiting_total = 0.0  # inside them
        self.waiting = False  # set by instrument_waits around each bounded wait
        self.own = False
        self.last = clock()
        self.cache: dict = {}
        self.own_codes = own_codes  # more code objects to count as paraflow's (the calibration probe)

    def _is_own(self, code) -> bool:
        own = self.cache.get(code)
        if own is None:
            own = self.cache[code] = code in self.own_codes or is_own_file(code.co_filename)
        return own

    def __call__(self, frame, event: str, arg) -> None:
        now = self.clock()
        if self.own and self.waiting:
            self.waiting_total += now - self.last
        elif self.own:
            self.total += now - self.last
            self.intervals += 1
        if event == "call":
            self.own = self._is_own(frame.f_code)
        elif event == "return":
            caller = frame.f_back
            self.own = caller is not None and self._is_own(caller.f_code)
        elif event == "c_call":
            self.own = False
        else:  # c_return, c_exception: back in the Python frame that made the call
            self.own = self._is_own(frame.f_code)
        self.last = self.clock()


def instrument_waits(
    lateness: list, clock: Callable[[], float] = time.perf_counter, hook: Optional[OwnTime] = None
) -> Callable[[], None]:
    """Record each bounded wait's lateness bound into `lateness` (and tell `hook` while one runs);
    returns the function that undoes it."""
    from ...reliability import deadlines

    original = deadlines.wait_until

    def wait_until(done, seconds, what):
        last_unfinished = [None]

        def probe():
            finished = done()
            now = clock()
            if not finished:
                last_unfinished[0] = now
            else:
                lateness.append(0.0 if last_unfinished[0] is None else now - last_unfinished[0])
            return finished

        if hook is not None:
            hook.waiting = True
        try:
            return original(probe, seconds, what)
        finally:
            if hook is not None:
                hook.waiting = False

    patched = [m for m in list(sys.modules.values()) if getattr(m, "wait_until", None) is original]
    for module in patched:
        module.wait_until = wait_until

    def undo() -> None:
        for module in patched:
            module.wait_until = original

    return undo


def _leaf(i: int) -> int:
    return i & 1


def _probe(n: int) -> int:
    total = 0
    for i in range(n):
        total += _leaf(i)
    return total


def dispatch_cost(calls: int = 2000, repeats: int = 5) -> float:
    """Seconds the profile hook's dispatch adds to each charged interval, measured here (>= 0).

    The median over `repeats` of (profiled own time - unprofiled time) / intervals for a probe
    that is all Python; ``profile_own_code`` subtracts it per interval.
    """
    codes = frozenset({_probe.__code__, _leaf.__code__})
    costs = []
    for _ in range(repeats):
        start = time.perf_counter()
        _probe(calls)
        plain = time.perf_counter() - start
        hook = OwnTime(own_codes=codes)
        sys.setprofile(hook)
        try:
            _probe(calls)
        finally:
            sys.setprofile(None)
        costs.append((hook.total - plain) / max(hook.intervals, 1))
    return max(0.0, sorted(costs)[len(costs) // 2])


def profile_own_code(run_step: Callable[[], float], steps: int) -> dict:
    """Run `steps` steps under the profile hook; per step: own Python seconds (less the hook's
    dispatch cost per interval) and late-waiting bound."""
    bias = dispatch_cost()
    own_s, waiting_s, late_s = [], [], []
    for _ in range(steps):
        lateness: list = []
        hook = OwnTime()
        undo = instrument_waits(lateness, hook=hook)
        sys.setprofile(hook)
        try:
            run_step()
        finally:
            sys.setprofile(None)
            undo()
        own_s.append(max(0.0, hook.total - hook.intervals * bias))
        waiting_s.append(hook.waiting_total)
        late_s.append(sum(lateness))
    return {
        "own_python_s": own_s,
        "waiting_python_s": waiting_s,
        "late_wait_s": late_s,
        "profiled_steps": steps,
        "profiler_dispatch_s": bias,
    }
