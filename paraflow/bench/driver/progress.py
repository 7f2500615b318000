"""What the terminal shows while the launches run: the cell, its launch, elapsed time, what remains.

In a terminal: one live rich progress line (the cell running, launches done of planned, elapsed,
an estimate of the time left), gone when the run ends so that the answer fills the screen;
failures stay printed above it. Elsewhere (a pipe, a log file, a test): plain lines, about ten
for the whole run (the first launch, every tenth of the way, the last, every failure). Every
launch's exact command and outcome go to results.md and results.json.
"""

from __future__ import annotations

import time
from typing import Optional

__all__ = ["LaunchProgress", "clock"]

#: Plain lines for a whole run, about (failures come on top).
PLAIN_LINES = 10


def clock(seconds: float) -> str:
    """`m:ss`."""
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


class LaunchProgress:
    """Progress over `total` planned launches (more may come: :meth:`add`), printed to `stream`."""

    def __init__(self, stream, total: int, started: Optional[float] = None, live: Optional[bool] = None) -> None:
        self.stream, self.total, self.done = stream, total, 0
        self.started = time.monotonic() if started is None else started
        self.launch_s: list = []
        self.printed = 0  # plain milestones printed (tenths of the way)
        self.live = None
        if stream is not None and (live if live is not None else _is_terminal(stream)):
            self.live = _rich_progress(stream, total)

    # ------------------------------------------------------------------ estimates
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> Optional[float]:
        """Seconds left, from the median launch so far times the launches left (None before the first)."""
        if not self.launch_s:
            return None
        typical = sorted(self.launch_s)[len(self.launch_s) // 2]
        return typical * max(0, self.total - self.done)

    def _where(self, label: str, heading: Optional[str], launch: int) -> str:
        left = self.remaining()
        eta = "" if left is None else f", ~{clock(left)} left"
        place = heading or f"[{launch:>{len(str(self.total))}}/{self.total}]"
        return f"{place} {clock(self.elapsed())} elapsed{eta} · {label}"

    # ------------------------------------------------------------------ events
    def add(self, launches: int) -> None:
        """More launches than planned (extra launches for wide intervals)."""
        self.total += launches
        if self.live is not None:
            self.live[0].update(self.live[1], total=self.total)

    def begin(self, label: str, heading: Optional[str] = None) -> None:
        self._current = (label, heading)
        if self.live is not None:
            self.live[0].update(self.live[1], description=self._where(label, heading, self.done + 1))

    def end(self, ok: bool, outcome: str, elapsed_s: float) -> None:
        """One launch ended: `outcome` is "ok" or the failure ("FAILED: ...", "TIMED OUT: ...")."""
        label, heading = self._current
        self.done += 1
        self.launch_s.append(elapsed_s)
        line = f"{self._where(label, heading, self.done)} · {outcome} ({elapsed_s:.1f} s)"
        if self.stream is None:
            return
        if self.live is not None:
            self.live[0].update(self.live[1], completed=self.done)
            if not ok:
                self.live[0].console.print(line, markup=False, highlight=False)
            return
        tenth = self.done * PLAIN_LINES // max(self.total, 1)
        if not ok or self.done in (1, self.total) or tenth > self.printed:
            self.printed = max(self.printed, tenth)
            print(line, file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """A line that stays (a launch not run)."""
        if self.stream is None:
            return
        if self.live is not None:
            self.live[0].console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.live is not None:
            self.live[0].stop()
            self.live = None


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _rich_progress(stream, total: int):
    """(rich Progress, task id) drawing one transient line on `stream`, or None without rich."""
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    except ImportError:
        return None
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(file=stream),
        transient=True,
    )
    task = progress.add_task("starting", total=total)
    progress.start()
    return progress, task
