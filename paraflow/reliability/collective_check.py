"""The cross-rank check on demand: before each collective, every rank learns what the others call.

torch's gloo does not check its inputs across ranks: an allreduce of float32[3] on one rank
and float32[4] on another returns a 3-element sum on the first and aborts the second; a
broadcast into a tensor of another dtype silently fills it with reinterpreted bytes. With
``check_collectives=True`` (``paraflow.init``) or ``PARAFLOW_DEBUG=1``, every public collective
first allgathers a small int64 descriptor (which collective, its number, dtype, shape, reduce op
or source rank, call site) through the backend's own allgather, and every rank raises the same
CollectiveError when they disagree, naming each rank, what it called and where. Without it a
mismatch shows in the stall report (:mod:`paraflow.reliability.stall`).
"""

from __future__ import annotations

import math
import os
import sys
import zlib
from typing import Any, Optional

import torch

from ..errors import CollectiveError
from .debug import debug_enabled, trace

__all__ = [
    "call_site",
    "site_of",
    "is_library",
    "call_text",
    "check_same_call",
    "describe",
    "mismatch_error",
    "COLLECTIVES",
    "DESCRIPTOR_WORDS",
]

COLLECTIVES = ("allreduce", "broadcast", "allgather", "barrier")
_OPS = ("sum", "mean", "min", "max")
_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
_MAGIC = 0x5041524146  # "PARAF": a descriptor, not some other collective's payload
_MAX_DIMS = 6
_SITE_BYTES = 96
_HEADER = 8  # magic, collective, sequence, dtype, ndim, numel, argument, shape hash
_SEQUENCE_WORD = 2
DESCRIPTOR_WORDS = _HEADER + _MAX_DIMS + _SITE_BYTES // 8
# Frames of these packages are not the user's call site: paraflow itself, the libraries that call
# back into it (torch's module call running a forward hook, horovod's optimizer step), contextlib.
LIBRARIES = frozenset({"paraflow", "torch", "horovod", "contextlib"})
#: paraflow's own programs that call its public API as a script does (the benchmark's ranks): their
#: lines are call sites, and the walk stops there as it does in a user's script.
USER_PROGRAMS = ("paraflow.bench.",)


_LIBRARY_CODE: dict = {}  # code object -> is it library code (a module's code keeps its module)
_SITES: dict = {}  # (code object, bytecode offset) -> "file:line"
_CACHE_LIMIT = 4096  # entries per cache; cleared when full (code made on the fly, in a notebook)


def is_library(frame) -> bool:
    """True for a frame of paraflow (but its USER_PROGRAMS), torch, horovod or contextlib: not
    the user's call site."""
    code = frame.f_code
    known = _LIBRARY_CODE.get(code)
    if known is None:
        if len(_LIBRARY_CODE) >= _CACHE_LIMIT:
            _LIBRARY_CODE.clear()
        name = frame.f_globals.get("__name__", "")
        known = _LIBRARY_CODE[code] = name.partition(".")[0] in LIBRARIES and not name.startswith(USER_PROGRAMS)
    return known


def call_site() -> str:
    """file:line of the script's line that led here: the first caller outside paraflow, torch and
    horovod (every collective asks, so the library test is remembered per code object and the
    site per code object and instruction)."""
    return site_of(sys._getframe(2))


def site_of(frame) -> str:
    """file:line of `frame`, or of its first caller outside paraflow, torch and horovod."""
    known = _LIBRARY_CODE.get  # the cached answer inline; is_library only for code not seen yet
    while frame is not None and ((library := known(frame.f_code)) or (library is None and is_library(frame))):
        frame = frame.f_back
    if frame is None:
        return "?"
    where = (frame.f_code, frame.f_lasti)
    site = _SITES.get(where)
    if site is None:
        if len(_SITES) >= _CACHE_LIMIT:
            _SITES.clear()
        site = _SITES[where] = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    return site


def _site_words(site: str) -> tuple:
    raw = site.encode()[:_SITE_BYTES].ljust(_SITE_BYTES, b"\0")
    return tuple(int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, _SITE_BYTES, 8))


def _tensor_words(dtype: Optional[torch.dtype], shape: Optional[tuple]) -> tuple:
    """dtype, ndim, numel, shape hash and the first dimensions (all -1 without a tensor)."""
    if dtype is None or shape is None:
        return (-1, -1, -1, -1, *([-1] * _MAX_DIMS))
    code = _DTYPES.index(dtype) if dtype in _DTYPES else 100 + zlib.crc32(str(dtype).encode())
    dims = (list(shape[:_MAX_DIMS]) + [-1] * _MAX_DIMS)[:_MAX_DIMS]
    numel = math.prod(shape)
    return (code, len(shape), numel, hash(shape) & ((1 << 62) - 1), *dims)  # ints hash alike in every process


def _encode(collective: str, sequence: int, tensor: Optional[torch.Tensor], argument: int, site: str) -> torch.Tensor:
    """The descriptor of call number `sequence`, as int64 words."""
    code, ndim, numel, shape_hash, *dims = _tensor_words(
        None if tensor is None else tensor.dtype, None if tensor is None else tuple(tensor.shape)
    )
    words = (_MAGIC, COLLECTIVES.index(collective), sequence, code, ndim, numel, argument, shape_hash)
    return torch.tensor((*words, *dims, *_site_words(site)), dtype=torch.int64)


def _argument(collective: str, argument: Any) -> int:
    """The descriptor's argument word: the allreduce op's index, the broadcast source, else -1."""
    if collective == "allreduce":
        return _OPS.index(argument)
    return argument if collective == "broadcast" else -1


def call_text(collective: str, sequence: int, tensor: Optional[torch.Tensor], argument: Any, site: str) -> str:
    """The call as the check and the stall report name it: ``allreduce(float32[4], op=sum) as
    collective #3 at train.py:12``; `argument` is the op or the source rank."""
    return str(_Descriptor(_encode(collective, sequence, tensor, _argument(collective, argument), site).tolist()))


def check_same_call(
    backend: Any, sequence: int, collective: str, tensor: Optional[torch.Tensor], argument: Any, site: str
) -> None:
    """Raise the same CollectiveError on every rank unless all are about to make the same call.

    One allgather of this rank's descriptor through the backend's own ``_allgather``; under
    PARAFLOW_DEBUG each rank also prints the call on stderr first.
    """
    mine = _encode(collective, sequence, tensor, _argument(collective, argument), site)
    if debug_enabled():
        trace(backend.rank, str(_Descriptor(mine.tolist())))
    rows = backend._allgather(mine.to(backend.device))
    descriptors = [_Descriptor(row.cpu().tolist()) for row in rows]
    if _mismatch(descriptors) is not None:
        raise mismatch_error(collective, backend.rank, descriptors)


class _Descriptor:
    """One rank's decoded descriptor."""

    def __init__(self, words: list[int]) -> None:
        self.valid = words[0] == _MAGIC and 0 <= words[1] < len(COLLECTIVES)
        self.collective = COLLECTIVES[words[1]] if self.valid else "?"
        self.sequence, self.dtype_code, self.ndim, self.numel, self.argument, self.shape_hash = (
            words[2],
            words[3],
            words[4],
            words[5],
            words[6],
            words[7],
        )
        dims = words[_HEADER : _HEADER + min(max(self.ndim, 0), _MAX_DIMS)]
        self.shape = "[" + ", ".join(map(str, dims)) + (", ...]" if self.ndim > _MAX_DIMS else "]")
        raw = b"".join(w.to_bytes(8, "little", signed=True) for w in words[_HEADER + _MAX_DIMS :])
        self.site = raw.rstrip(b"\0").decode(errors="replace") or "?"

    @property
    def dtype(self) -> str:
        if 0 <= self.dtype_code < len(_DTYPES):
            return str(_DTYPES[self.dtype_code]).replace("torch.", "")
        return "?"

    def key(self, field: str):
        return {
            "collective": self.collective,
            "sequence": self.sequence,
            "dtype": self.dtype_code,
            "shape": (self.ndim, self.numel, self.shape_hash),
            "argument": self.argument,
        }[field]

    def __str__(self) -> str:
        if not self.valid:
            return "something that is not a paraflow collective (a raw torch.distributed or horovod call?)"
        if self.collective == "barrier":
            call = "barrier()"
        else:
            arg = {
                "allreduce": f", op={_OPS[self.argument] if 0 <= self.argument < len(_OPS) else '?'}",
                "broadcast": f", src={self.argument}",
                "allgather": "",
            }[self.collective]
            call = f"{self.collective}({self.dtype}{self.shape}{arg})"
        return f"{call} as collective #{self.sequence} at {self.site}"


_WHAT = {
    "collective": "ranks called different collectives",
    "sequence": (
        "ranks have made different numbers of paraflow collectives (a backend created again on some ranks only?)"
    ),
    "dtype": "the tensor's dtype differs across ranks",
    "shape": "the tensor's shape differs across ranks",
    "argument": "ranks passed different arguments",
}


def describe(descriptors: list[_Descriptor]) -> str:
    """Every rank and what it called, ranks with the same call grouped."""
    groups: dict[str, list[int]] = {}
    for rank, d in enumerate(descriptors):
        groups.setdefault(str(d), []).append(rank)
    parts = []
    for text, ranks in groups.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        parts.append(f"{who} called {text}")
    return "; ".join(parts)


def _mismatch(descriptors: list[_Descriptor]) -> Optional[str]:
    if not all(d.valid for d in descriptors):
        return "a rank is inside a different collective"
    for field in ("collective", "dtype", "shape", "argument", "sequence"):
        if len({d.key(field) for d in descriptors}) > 1:
            return _WHAT[field]
    return None


def mismatch_error(collective: str, rank: int, descriptors: list[_Descriptor]) -> CollectiveError:
    """The error every rank raises when the descriptors disagree."""
    problem = _mismatch(descriptors) or "the ranks' descriptors differ"
    return CollectiveError(
        f"{collective} on rank {rank}: {problem}: {describe(descriptors)}. Every rank must call the same "
        f"collectives in the same order, with tensors of the same shape and dtype and the same op / src."
    )
