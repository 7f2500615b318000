"""The check through shared memory: ranks on one host post their descriptors on a board.

A check frame is a collective of its own, and on a busy host even a small one costs a round
trip through the library's threads (a 1 MB allreduce over gloo cost 1.4-1.6x the raw call with
the frame beside it or the check bundled into it). Ranks that share a host need no message to
see each other's descriptors: each posts its descriptor in memory all of them map, and the
collective itself is the barrier. Once every rank has agreed on the same call BUNDLE_AFTER
times in a row, the next call of every rank posts its descriptor, then runs that repeated call
(on its own tensor when its call is the repeated one, on zeros otherwise, so every rank runs
the same collective whatever each was about to do). A rank's collective cannot complete before
every rank has started it, and every rank posts before it starts: once it completes, every
rank's descriptor for this call is on the board. Then, as with the bundle:

- all equal to the repeated call: the collective's result is the result;
- all equal to each other but a different call: nothing is wrong; the call runs the usual way;
- otherwise every rank raises the same CollectiveError (an in-place call's tensor then holds
  an unusable result, as after an overlapped frame).

The board is opened once, by every rank at the same call, with two collectives: rank 0
creates a file in /dev/shm and broadcasts its name, every rank maps it and says whether it
could (and shares rank 0's network namespace: emulated hosts are not one host), and the board
is used only if all could; rank 0 then removes the file (the mappings stay). Only for tensors
on the CPU, whose collectives have completed on this host when their wait returns.
PARAFLOW_SHARED_CHECK=0 turns it off (the frame or the bundle checks instead).
"""

from __future__ import annotations

import mmap
import os
import secrets
import struct
import tempfile
import time
from typing import Callable, Optional

import torch

from .collective_check import _COMPARED_BYTES, _DESCRIPTOR_BYTES, _PACK, _SEQUENCE_WORD, _Descriptor, mismatch_error

__all__ = ["CheckBoard", "board_for", "on_board", "ENVIRONMENT_SWITCH"]

ENVIRONMENT_SWITCH = "PARAFLOW_SHARED_CHECK"
#: Slots per rank, used in turn: a rank cannot be a whole collective ahead of another (it would
#: need that rank in the next collective), so two would do.
SLOTS = 4
_STAMP = 8  # the call's sequence number, written after the descriptor
_SLOT_BYTES = _STAMP + _DESCRIPTOR_BYTES
_COMPARED_SLOT = _STAMP + _COMPARED_BYTES  # a slot's stamp and the compared part of its descriptor
_SEQUENCE_AT = _STAMP + 8 * _SEQUENCE_WORD  # where a slot holds the descriptor's sequence number
_STAMP_WORD = struct.Struct("<q")
_NONCE = 8  # the file starts with rank 0's random number: the right file, not a namesake
_NOTE_BYTES = 256  # rank 0's broadcast: nonce, namespace, file name
_STAMP_WAIT_S = 5.0
_SHM = "/dev/shm"


class CheckBoard:
    """Every rank's descriptor of its current call, in memory the ranks of one host share."""

    def __init__(self, memory: mmap.mmap, world_size: int, rank: int) -> None:
        self._memory, self._view = memory, memoryview(memory)
        self.world_size, self.rank = world_size, rank
        # Where each rank's slot starts, per slot index (sequence % SLOTS): computed once, read every call.
        self._slots = [[self._offset(index, r) for r in range(world_size)] for index in range(SLOTS)]

    def _offset(self, sequence: int, rank: int) -> int:
        return _NONCE + ((sequence % SLOTS) * self.world_size + rank) * _SLOT_BYTES

    def post(self, sequence: int, words: list) -> None:
        """Put this rank's descriptor of call `sequence` on the board (the stamp last)."""
        at = self._slots[sequence % SLOTS][self.rank]
        _PACK.pack_into(self._memory, at + _STAMP, *words)
        _STAMP_WORD.pack_into(self._memory, at, sequence)

    def post_packed(self, sequence: int, descriptor: bytes) -> None:
        """post() of a descriptor packed once with sequence number 0 (a repeated call's): the
        number is written in."""
        memory, at = self._memory, self._slots[sequence % SLOTS][self.rank]
        memory[at + _STAMP : at + _SLOT_BYTES] = descriptor
        _STAMP_WORD.pack_into(memory, at + _SEQUENCE_AT, sequence)
        _STAMP_WORD.pack_into(memory, at, sequence)

    def _block(self, sequence: int) -> bytes:
        """Every rank's slot of call `sequence`, in rank order, in one read."""
        at = self._offset(sequence, 0)
        return self._view[at : at + self.world_size * _SLOT_BYTES].tobytes()

    def agree(self, sequence: int) -> bool:
        """True when every rank posted call `sequence` and every compared part equals rank 0's
        (the common case, checked first)."""
        memory, starts = self._memory, self._slots[sequence % SLOTS]
        first = memory[starts[0] : starts[0] + _COMPARED_SLOT]
        if _STAMP_WORD.unpack_from(first)[0] != sequence:
            return False
        for at in starts[1:]:
            if memory[at : at + _COMPARED_SLOT] != first:
                return False
        return True

    def rows(self, sequence: int) -> list:
        """Every rank's descriptor of call `sequence`, as bytes (waits briefly for a late stamp,
        which only a rank that never posted this call can leave; its old descriptor then says so)."""
        stamp = sequence.to_bytes(_STAMP, "little", signed=True)
        deadline = None
        while True:
            block = self._block(sequence)
            slots = [block[i : i + _SLOT_BYTES] for i in range(0, len(block), _SLOT_BYTES)]
            if all(slot[:_STAMP] == stamp for slot in slots):
                break
            deadline = deadline or time.monotonic() + _STAMP_WAIT_S
            if time.monotonic() > deadline:
                break
            time.sleep(0)
        return [slot[_STAMP:] for slot in slots]

    def confirm(self, sequence: int) -> None:
        """After call `sequence` completed: raise the same CollectiveError on every rank unless
        every rank posted the same call."""
        if self.agree(sequence):
            return
        rows = self.rows(sequence)  # a late stamp, or a mismatch
        first = rows[0][:_COMPARED_BYTES]
        if not all(row[:_COMPARED_BYTES] == first for row in rows[1:]):
            descriptors = [_Descriptor(list(_PACK.unpack(row))) for row in rows]
            raise mismatch_error(descriptors[self.rank].collective, self.rank, descriptors)

    def close(self) -> None:
        self._view.release()
        self._memory.close()


def _namespace() -> int:
    try:
        return os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return -1


def _switched_on() -> bool:
    return os.environ.get(ENVIRONMENT_SWITCH, "1") != "0"


def _open(backend) -> Optional[CheckBoard]:
    """Open the board on every rank (two collectives, every rank at the same call), or None."""
    n, rank = backend.world_size, backend.rank
    size = _NONCE + n * SLOTS * _SLOT_BYTES
    nonce, path = secrets.randbits(63), ""
    if rank == 0 and _switched_on():
        try:
            fd, path = tempfile.mkstemp(prefix="paraflow-check-", dir=_SHM)
            try:
                os.ftruncate(fd, size)
                os.pwrite(fd, nonce.to_bytes(_NONCE, "little"), 0)
            finally:
                os.close(fd)
        except OSError:
            path = ""
    try:
        note = bytearray(_NOTE_BYTES)
        encoded = path.encode()[: _NOTE_BYTES - 16]
        note[0:16] = nonce.to_bytes(8, "little") + _namespace().to_bytes(8, "little", signed=True)
        note[16 : 16 + len(encoded)] = encoded
        got = bytes(backend._broadcast(torch.frombuffer(note, dtype=torch.uint8).clone(), 0).tolist())
        memory = _map(got, size)
        agreed = backend._allgather(torch.tensor([int(memory is not None)], dtype=torch.int64))
    finally:
        if path:
            os.unlink(path)
    if memory is not None and all(int(flag) for flag in agreed):
        return CheckBoard(memory, n, rank)
    if memory is not None:
        memory.close()
    return None


def _map(note: bytes, size: int) -> Optional[mmap.mmap]:
    """Map the file rank 0 named in `note`, if this rank may and can see it (None otherwise)."""
    path = note[16:].rstrip(b"\0").decode(errors="replace")
    same_namespace = int.from_bytes(note[8:16], "little", signed=True) == _namespace()
    if not path or not same_namespace or not _switched_on():
        return None
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        memory = mmap.mmap(fd, size)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if memory[:_NONCE] != note[:_NONCE]:
        memory.close()
        return None
    return memory


def board_for(backend) -> Optional[CheckBoard]:
    """The backend's board, opened at the first call that could use it (the same call on every rank)."""
    board = getattr(backend, "_check_board", None)
    if board is None:
        board = (backend.device.type == "cpu" and _open(backend)) or False
        backend._check_board = board
    return board or None


def _start(backend, spec: tuple) -> Callable:
    """Start `spec`'s collective on zeros (a rank whose own call is another one)."""
    collective, dtype, shape, op, src = spec
    zeros = torch.zeros(shape, dtype=dtype, device=backend.device)
    if collective == "allreduce":
        return backend._start_allreduce(zeros, op)
    if collective == "broadcast":
        return backend._start_broadcast(zeros, src)
    return backend._start_allgather(zeros)


def on_board(backend, board: CheckBoard, spec: tuple, words: list, start: Optional[Callable]):
    """Run the repeated call `spec` with every rank's descriptor (`words`) on the board; `start`
    starts this rank's own call when it is the repeated one (else None). Returns the result's
    getter if every rank made the repeated call, None if they all made the same other call (run
    it the usual way); raises CollectiveError on every rank otherwise."""
    sequence = words[_SEQUENCE_WORD]
    board.post(sequence, words)
    result = (start or (lambda: _start(backend, spec)))()()
    board.confirm(sequence)
    return None if start is None else (lambda: result)
