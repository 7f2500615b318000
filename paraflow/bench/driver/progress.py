"""What the terminal shows while the launches run: the cell, its launch, elapsed time, what remains.

About ten plain lines for the whole run (the first launch, every tenth of the way, the last) and
one per failed launch, in a terminal as in a pipe or a log file. Every launch's exact command and
outcome go to results.md and results.json.
"""

from __future__ import annotations

import time
from typing import Optional

__all__ = ["LaunchProgress", "clock"]

#: Lines for a whole run, about (failures come on top).
PLAIN_LINES = 10


def clock(seconds: float) -> str:
    """`m:ss`."""
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


class LaunchProgress:
    """Progress over `total` planned launches (more may come: :meth:`add`), printed to `stream`."""

    def __init__(self, stream, total: int, started: Optional[float] = None) -> None:
        self.stream, self.total, self.done = stream, total, 0
        self.started = time.monotonic() if started is None else started
        self.launch_s: list = []
        self.printed = 0  # milestones printed (tenths of the way)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> Optional[float]:
        """Seconds left, from the median launch so far times the launches left (None before the first)."""
        if not self.launch_s:
            return None
        typical = sorted(self.launch_s)[len(self.launch_s) // 2]
        return typical * max(0, self.total - self.done)

    def add(self, launches: int) -> None:
        """More launches than planned (extra launches for wide intervals)."""
        self.total += launches

    def begin(self, label: str, heading: Optional[str] = None) -> None:
        self._current = (label, heading)

    def end(self, ok: bool, outcome: str, elapsed_s: float) -> None:
        """One launch ended: `outcome` is "ok" or the failure ("FAILED: ...", "TIMED OUT: ...")."""
        label, heading = self._current
        self.done += 1
        self.launch_s.append(elapsed_s)
        tenth = self.done * PLAIN_LINES // max(self.total, 1)
        if self.stream is None or (ok and self.done not in (1, self.total) and tenth <= self.printed):
            return
        self.printed = max(self.printed, tenth)
        left = None if heading else self.remaining()  # an extra launch: no plan to count down
        eta = "" if left is None else f", ~{clock(left)} left"
        place = heading or f"[{self.done:>{len(str(self.total))}}/{self.total}]"
        line = f"{place} {clock(self.elapsed())} elapsed{eta} · {label} · {outcome} ({elapsed_s:.1f} s)"
        print(line, file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """A line that stays (a launch not run)."""
        if self.stream is not None:
            print(text, file=self.stream, flush=True)
