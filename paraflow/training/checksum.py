"""A CRC-32 of every byte of a checkpoint, written with it and checked before it is loaded.

``torch.load`` does not verify the CRCs its zip archive carries: a byte flipped inside a tensor's
data loads as a silently different weight. So the checkpoint writer computes a CRC-32 of every
byte ``torch.save`` writes, as it writes them (no second pass), and stores it in the archive's
own comment field, in the same file and the same atomic write. Any zip reader, ``torch.load``
included, still opens the file. On load the whole file is read once to recompute it before
``torch.load`` reads the same open file.

The stored value covers the archive exactly as ``torch.save`` wrote it, whose last two bytes (the
comment length) were zero; the comment is ``paraflow-crc32:`` and eight hexadecimal digits.
"""

from __future__ import annotations

import os
import zlib
from typing import IO, Any, Callable, Optional

import torch

__all__ = ["MARKER", "ChecksumMismatch", "write_with_checksum", "verify_checksum"]

MARKER = b"paraflow-crc32:"
_COMMENT = len(MARKER) + 8
_END_RECORD = 22  # the zip archive's end-of-central-directory record, without its comment
_END_SIGNATURE = b"PK\x05\x06"
_CHUNK = 16 << 20


class ChecksumMismatch(ValueError):
    """The file's bytes no longer match the CRC-32 written with them."""


class _ChecksumWriter:
    """Passes writes to `f`, keeping the CRC-32 and the last bytes of everything written, and the
    OSError a write raised (torch reports a failed write as "unexpected pos", hiding it)."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.crc = 0
        self.tail = b""
        self.error: Optional[OSError] = None

    def write(self, data: Any) -> int:
        try:
            written = self._f.write(data)
        except OSError as exc:
            self.error = exc
            raise
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.tail = (self.tail + bytes(view[-_END_RECORD:]))[-_END_RECORD:]
        return written

    def flush(self) -> None:
        self._f.flush()


def write_with_checksum(payload: Any, f: IO[bytes], save: Callable[[Any, Any], None] = torch.save) -> None:
    """``save(payload, f)``, then the CRC-32 of every byte written stored as the archive's comment.

    Raises:
        OSError: a write failed (a full disk: ENOSPC), rather than torch's "unexpected pos".
    """
    writer = _ChecksumWriter(f)
    try:
        save(payload, writer)
    except Exception as exc:
        if writer.error is not None and writer.error is not exc:
            raise writer.error from exc
        raise
    if not (writer.tail.startswith(_END_SIGNATURE) and writer.tail[-2:] == b"\0\0"):
        raise ValueError("torch.save did not end its archive with an end record without a comment")
    f.seek(-2, os.SEEK_END)
    f.write(_COMMENT.to_bytes(2, "little") + MARKER + b"%08x" % writer.crc)


def verify_checksum(f: IO[bytes]) -> bool:
    """Check the CRC-32 stored in `f` (an open binary file) against its bytes; rewind `f`.

    Returns:
        True when the file carries a checksum and it matches; False when it carries none.

    Raises:
        ChecksumMismatch: the checksum does not match, or cannot be read.
    """
    size = f.seek(0, os.SEEK_END)
    tail_size = _END_RECORD + _COMMENT
    if size < tail_size:
        f.seek(0)
        return False
    f.seek(size - tail_size)
    tail = f.read(tail_size)
    if not (
        tail.startswith(_END_SIGNATURE)
        and tail[_END_RECORD - 2 : _END_RECORD] == _COMMENT.to_bytes(2, "little")
        and tail[_END_RECORD:].startswith(MARKER)
    ):
        f.seek(0)
        return False
    digits = tail[-8:]
    f.seek(0)
    crc = _crc_of_prefix(f, size - _COMMENT - 2)
    crc = zlib.crc32(b"\0\0", crc)  # the comment length as torch.save wrote it
    f.seek(0)
    try:
        expected = int(digits, 16)
    except ValueError:
        raise ChecksumMismatch(f"its stored CRC-32 is unreadable ({digits!r})") from None
    if crc != expected:
        raise ChecksumMismatch(
            f"its CRC-32 is {crc:08x}, but {expected:08x} was stored when it was written, so bytes changed after "
            "the write (storage, copy or transfer)"
        )
    return True


def _crc_of_prefix(f: IO[bytes], length: int) -> int:
    buffer = bytearray(min(_CHUNK, max(length, 1)))
    view = memoryview(buffer)
    crc, remaining = 0, length
    while remaining > 0:
        n = f.readinto(view[: min(len(buffer), remaining)])
        if not n:
            break
        crc = zlib.crc32(view[:n], crc)
        remaining -= n
    return crc
