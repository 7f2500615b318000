"""Gradient compression for DDP: hooks whose Python continuations are released before the interpreter exits.

``compression`` "fp16" / "bf16" registers :func:`compress_hook`, which does what torch's
``fp16_compress_hook`` / ``bf16_compress_hook`` do, under a name DDP does not refuse for bf16
over gloo (DDP refuses a hook named ``bf16_compress_hook`` unless NCCL >= 2.10 is present, a
check meant for NCCL, while gloo reduces bfloat16 itself). Horovod maps the same option to
``hvd.Compression``; one-process backends (single, dp) communicate no gradients, so they accept
``none`` only.

A DDP hook returns ``future.then(continuation)``. Over gloo the continuation runs on one of the
process group's worker threads, and that thread drops its reference to the continuation only
*after* the returned future has completed, taking the GIL to do so. The main thread may meanwhile
finish training and start the interpreter's shutdown; a thread that asks for the GIL then is ended
by CPython, and ending it inside a C++ destructor aborts the process ("terminate called without an
active exception") after a run that succeeded. So every continuation created here is tracked, and
`release_continuations` (called at backend shutdown and at exit) waits until each one that has run
is released.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist

from ...reliability.deadlines import DeadlineExceeded, spin_until

__all__ = ["compress_hook", "pending_continuations", "release_continuations", "tracked_then"]

_live: weakref.WeakSet[_Continuation] = weakref.WeakSet()
_atexit_registered = False


class _Continuation:
    """A callable run by a future, which records that it ran."""

    __slots__ = ("fn", "ran", "__weakref__")

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn, self.ran = fn, False

    def __call__(self, fut: Any) -> Any:
        self.ran = True
        return self.fn(fut)


def tracked_then(fut: torch.futures.Future, fn: Callable[[Any], Any]) -> torch.futures.Future:
    """``fut.then(fn)``, with `fn` tracked until the thread that ran it lets it go."""
    global _atexit_registered
    continuation = _Continuation(fn)
    _live.add(continuation)
    if not _atexit_registered:
        atexit.register(release_continuations)
        _atexit_registered = True
    return fut.then(continuation)


def pending_continuations() -> int:
    """How many continuations have run but are still held by the thread that ran them."""
    return sum(1 for c in list(_live) if c.ran)


def release_continuations(timeout: float = 5.0) -> bool:
    """Wait (sleeping, so the GIL is free) until every continuation that ran is released.

    Continuations that have not run (their communication is still pending, for example because a
    peer died) are not waited for. Returns True when none is left, False after `timeout` seconds.
    """
    try:
        spin_until(lambda: not pending_continuations(), timeout, "releasing DDP hook continuations", sleep=True)
    except DeadlineExceeded:
        return False
    return True


def compress_hook(dtype: torch.dtype) -> Callable[[Any, dist.GradBucket], torch.futures.Future]:
    """torch's ``fp16_compress_hook`` / ``bf16_compress_hook`` for `dtype`, with a tracked continuation.

    The bucket is cast to `dtype` and divided by the world size (so the 16-bit sum cannot
    overflow), allreduced, and copied back into the bucket in its own dtype.
    """

    def hook(state, bucket):  # unannotated: DDP checks hook annotations
        group = state if state is not None else dist.group.WORLD
        buffer = bucket.buffer()
        compressed = buffer.to(dtype).div_(group.size())

        def decompress(fut):
            return buffer.copy_(fut.value()[0])

        return tracked_then(dist.all_reduce(compressed, group=group, async_op=True).get_future(), decompress)

    hook.__name__ = hook.__qualname__ = f"{str(dtype).replace('torch.', '')}_compress"
    return hook
