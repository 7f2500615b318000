"""The cross-rank check's exchange, built so that checking costs as little as the collective allows.

Every checked collective starts with one allgather of a fixed-size frame (same size on every
rank whatever the tensors, so it is safe when they disagree): this rank's descriptor
(:mod:`paraflow.reliability.collective_check`), then room for CARRY_BYTES of payload.

- A tensor that fits travels in the frame: the collective's result is computed from the
  gathered frames and no second collective runs (small messages are latency-bound, and two
  round trips would cost twice one).
- A larger tensor whose call repeats the last one every rank agreed on (same collective, dtype,
  shape and op or source: a training loop, a sweep) has its own collective started right after
  the frame's, before the frame is checked, so the two overlap instead of following each other.
  The frame says so. If the frames then disagree, every rank that did not start it runs the same
  call on zeros, so the started collectives complete, and every rank raises the same
  CollectiveError: the job goes on as after any other mismatch (only an in-place call's tensor
  holds the unusable result).
- Otherwise the frames are checked first and the collective runs after.

Once every rank has agreed on the same call BUNDLE_AFTER times in a row, no frame is sent:
ranks of one host post their descriptors in shared memory and the repeated collective is the
barrier (:mod:`paraflow.reliability.check_board`), whatever its size (a small one then costs one
collective of its own size instead of a frame); ranks on several hosts over gloo carry them in
the repeated allreduce itself when it is larger than a frame's payload
(:mod:`paraflow.reliability.check_bundle`). The repeated call itself, made again with the board
open, takes a short path (:mod:`paraflow.core.repeated_call`): the same posting and reading of
the board, with the descriptor packed once.

Overlapping needs the backend's asynchronous hooks (``_start_allgather``, ``_start_allreduce``,
``_start_broadcast``, each returning a function that waits and gives the result); without them
the check runs first.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .check_board import board_for, on_board
from .check_bundle import bundle_spec, bundled, forget_agreed, note_agreed, repeated_call
from .collective_check import (
    _COMPARED_BYTES,
    _DESCRIPTOR_BYTES,
    _OPS,
    _PACK,
    _SEQUENCE_WORD,
    CARRY_BYTES,
    FRAME_BYTES,
    _call_words,
    _Descriptor,
    call_site,
    mismatch_error,
)
from .debug import debug_enabled, trace

__all__ = ["exchange", "packed_descriptor", "forget_agreements", "Outcome", "FRAME_NAME"]

#: The frame's collective name where the library matches collectives by name (horovod).
FRAME_NAME = "paraflow.check"
#: The backend's asynchronous hook for each collective.
_STARTERS = {name: f"_start_{name}" for name in ("allreduce", "broadcast", "allgather")}
_STARTED = _DESCRIPTOR_BYTES  # first byte after the descriptor: 1 when this rank started its collective


@dataclass
class Outcome:
    """What the exchange leaves to do: `carried` holds every rank's tensor (nothing left to send),
    `finish` waits for the collective started alongside the frame; neither: run it now."""

    carried: Optional[list] = None
    finish: Optional[Callable] = None


@functools.lru_cache(maxsize=1024)
def _call_facts(collective: str, dtype, shape, op, src, site: str, carry: bool) -> tuple:
    """What a call's check needs, computed once per kind of call (a loop repeats its calls):
    its descriptor with sequence number 0, what is compared (all but the sequence number and the
    call site), its size in bytes, whether it may ride in the frame, and its spec (None for a barrier)."""
    argument = _OPS.index(op) if op in _OPS else (src if src is not None else -1)
    static = _call_words(collective, dtype, shape, argument, site)
    key = (static[1], *static[3:14])
    nbytes = math.prod(shape) * dtype.itemsize if dtype is not None else 0
    fits = carry and dtype is not None and nbytes <= CARRY_BYTES
    spec = (collective, dtype, tuple(shape), op, src) if dtype is not None else None
    return static, key, nbytes, fits, spec


def _gather(backend, frame: torch.Tensor) -> list:
    start = getattr(backend, "_start_allgather", None)
    return start(frame, FRAME_NAME)() if start is not None else backend._allgather(frame)


def _drain(backend, spec: tuple) -> None:
    """Run the call `spec` describes on zeros, so ranks that started it can finish; its errors do not matter."""
    collective, dtype, shape, op, src = spec
    zeros = torch.zeros(shape, dtype=dtype, device=backend.device)
    try:
        if collective == "allreduce":
            backend._allreduce(zeros, op)
        elif collective == "broadcast":
            backend._broadcast(zeros, src)
        else:
            backend._allgather(zeros)
    except Exception:  # noqa: BLE001 - the CollectiveError that follows says what went wrong
        pass


def exchange(
    backend,
    sequence: int,
    collective: str,
    tensor: Optional[torch.Tensor] = None,
    op: Optional[str] = None,
    src: Optional[int] = None,
    carry: bool = False,
    start: Optional[Callable[[], Callable]] = None,
    in_place: bool = False,
    site: Optional[str] = None,
) -> Outcome:
    """Check that every rank is about to run the same collective; raise CollectiveError everywhere if not.

    Args:
        backend: an initialised multi-process backend (rank, device, its unchecked collectives).
        sequence: this collective's number on this rank (1, 2, ...).
        collective: allreduce, broadcast, allgather or barrier.
        tensor: the tensor about to be communicated (None for a barrier).
        op: the allreduce op.
        src: the broadcast source rank.
        carry: send `tensor` in the frame when it fits.
        start: starts the collective itself and returns the function that waits for its result
            (None: the caller runs it).
        in_place: the caller copies the result into its own tensor at once (a bundle may reuse its buffer).
        site: the user's call site (found here if None).
    """
    static, key, nbytes, fits, spec = _call_facts(
        collective,
        None if tensor is None else tensor.dtype,
        None if tensor is None else tensor.shape,
        op,
        src,
        site or call_site(),
        carry,
    )
    words = list(static)
    words[_SEQUENCE_WORD] = sequence
    traced = getattr(backend, "_traced", None)
    if traced is None:  # read once per backend: not on every call
        traced = backend._traced = debug_enabled()
    if traced:
        trace(backend.rank, str(_Descriptor(words)))
    repeated = repeated_call(backend)
    board = repeated and getattr(backend, _STARTERS[repeated[1][0]], None) and board_for(backend)
    bundle = None if board else bundle_spec(backend, CARRY_BYTES)
    if board or bundle is not None:  # the repeated call carries the check: every rank runs it
        mine = key == repeated[0]
        try:
            if board:  # check_board.py: ranks of one host post their descriptors in shared memory
                finish = on_board(backend, board, repeated[1], words, start if mine else None)
            else:  # check_bundle.py: the repeated allreduce carries them
                finish = bundled(backend, bundle[1], words, tensor if mine else None, reuse=in_place)
        except Exception:
            forget_agreements(backend)
            raise
        if finish is not None:
            note_agreed(backend, key, spec)
            return Outcome(finish=finish)
        forget_agreed(backend)  # every rank agreed on another call: the usual way
    last = getattr(backend, "_last_agreed", None)
    overlap = start is not None and not fits and last is not None and last[0] == key
    frame = bytearray(FRAME_BYTES)
    _PACK.pack_into(frame, 0, *words)
    frame[_STARTED] = int(overlap)
    mine = torch.frombuffer(frame, dtype=torch.uint8)
    if backend.device.type == "cuda":
        mine = mine.to(backend.device)
    if fits and nbytes:
        mine[_DESCRIPTOR_BYTES : _DESCRIPTOR_BYTES + nbytes].copy_(tensor.detach().reshape(-1).view(torch.uint8))
    if overlap:
        finish_frame = backend._start_allgather(mine, FRAME_NAME)
        finish = start()
        rows = finish_frame()
    else:
        finish, rows = None, _gather(backend, mine)
    first = rows[0][:_COMPARED_BYTES]  # everything but the call site
    if all(torch.equal(row[:_COMPARED_BYTES], first) for row in rows[1:]):
        note_agreed(backend, key, spec)
        if spec is not None and start is not None:
            backend._last_agreed = (key, spec)
        if fits:
            body = slice(_DESCRIPTOR_BYTES, _DESCRIPTOR_BYTES + nbytes)
            return Outcome(carried=[row[body].view(tensor.dtype).view(tensor.shape) for row in rows])
        return Outcome(finish=finish)
    started = [bool(int(row[_STARTED])) for row in rows]
    if finish is not None:
        try:
            finish()  # the others run the same call on zeros
        except Exception:  # noqa: BLE001 - the mismatch is the error to report
            pass
    elif any(started) and last is not None:
        _drain(backend, last[1])
    forget_agreements(backend)
    descriptors = [_Descriptor(row[:_DESCRIPTOR_BYTES].cpu().view(torch.int64).tolist()) for row in rows]
    raise mismatch_error(collective, backend.rank, descriptors)


def packed_descriptor(spec: tuple, site: str) -> bytes:
    """The board descriptor of the call `spec` (collective, dtype, shape, op, src) made at
    `site`, packed, with sequence number 0 (:meth:`CheckBoard.post_packed` writes the number in)."""
    collective, dtype, shape, op, src = spec
    return _PACK.pack(*_call_facts(collective, dtype, shape, op, src, site, True)[0])


def forget_agreements(backend) -> None:
    """After a mismatch or a failure: nothing the ranks agreed on before may start a call early."""
    backend._last_agreed = None
    forget_agreed(backend)
