"""How the processes of :func:`paraflow.launch` ended, and the error the caller gets when one failed."""

from __future__ import annotations

import collections
import linecache
import re
import signal
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..errors import LaunchTimeoutError, RankFailedError

__all__ = ["RankOutcome", "raise_for_outcomes", "with_sources"]

_TAIL_LINES = 30
_DYNAMIC_FRAME = re.compile(r'^( *)File "<dynamic-code>", line (\d+), in (\S+)$', re.MULTILINE)


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

    def summary(self) -> str:
        """One line: what it raised or how it died."""
        if self.error:
            lines = self.error["message"].strip().splitlines()
            return f"{self.error['type']}: {lines[0] if lines else ''}"
        return _exit_text(self.returncode)


def raise_for_outcomes(outcomes: list[RankOutcome], time_limit: Optional[float]) -> None:
    """Raise RankFailedError for the first rank that failed, else LaunchTimeoutError if one was stopped."""
    n = len(outcomes)
    failed = [o for o in outcomes if o.status in ("error", "died")]
    if failed:
        first = min(failed, key=RankOutcome.when)
        others = {o.rank: o.summary() for o in failed if o is not first}
        if first.error:
            kind, text = first.error["type"], first.error["traceback"]
            head = f"rank {first.rank} of {n} raised {first.summary()}"
        else:
            kind, text = _exit_text(first.returncode), "\n".join(first.tail) or "(no output)"
            head = f"rank {first.rank} of {n} died ({kind}) without returning; its last output is below"
        also = "".join(f"\nrank {r} failed too: {s}" for r, s in sorted(others.items()))
        stopped = [o.rank for o in outcomes if o.status == "unfinished"]
        ended = f"\nThe others were stopped: {_ranks(stopped)}." if stopped else ""
        raise RankFailedError(
            f"{head}\n\n--- rank {first.rank} ---\n{text.rstrip()}\n---{also}{ended}", first.rank, kind, text, others
        )
    unfinished = [o.rank for o in outcomes if o.status == "unfinished"]
    if unfinished:
        last = outcomes[unfinished[0]]
        tail = "\n".join(list(last.tail)[-10:]) or "(no output)"
        raise LaunchTimeoutError(
            f"{_ranks(unfinished)} of {n} did not finish within time_limit={time_limit:g} s; "
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


def _ranks(ranks: list) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _exit_text(returncode: Optional[int]) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"
