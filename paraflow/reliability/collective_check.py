"""Debug mode and the cross-rank check it turns on.

Debug mode, ``PARAFLOW_DEBUG=1``, turns on:

- the cross-rank check before every public collective (``check_collectives``, below):
  mismatching calls raise CollectiveError at once;
- ``TORCH_DISTRIBUTED_DEBUG=INFO`` before the process group starts, unless the variable is
  already set: DDP then logs its set-up and names the parameters that got no gradient. (torch
  2.13's ``DETAIL`` level wraps the process group in a checker that crashes DDP's constructor
  with a segmentation fault on gloo, so paraflow does not pick it; set it yourself to try.)
- one line on stderr per rank before each paraflow collective (sequence number, call, call site),
  so the last line each rank printed shows where a stuck job stopped.

The cross-rank check: before each collective, every rank learns what the others call. torch's
gloo does not check its inputs across ranks: an allreduce of float32[3] on one rank and
float32[4] on another returns a 3-element sum on the first and aborts the second; a broadcast
into a tensor of another dtype silently fills it with reinterpreted bytes. With
``check_collectives=True`` (``paraflow.init``) or ``PARAFLOW_DEBUG=1``, every public collective
first allgathers a small descriptor (which collective, its number, dtype, shape, reduce op or
source rank, call site; JSON in a fixed-size byte tensor) through the backend's own allgather,
and every rank raises the same CollectiveError when they disagree, naming each rank, what it
called and where. Without it a mismatch shows in the stall report
(:mod:`paraflow.reliability.stall`).
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, NamedTuple, Optional

import torch
import torch.distributed

from ..errors import CollectiveError
from .activity import ranks_text

__all__ = [
    "DEBUG_ENV",
    "debug_enabled",
    "enable_torch_debug",
    "call_text",
    "check_same_call",
    "describe",
    "mismatch_error",
    "Call",
    "encode_calls",
    "decode_calls",
    "recorded_mismatch_error",
]

DEBUG_ENV = "PARAFLOW_DEBUG"
TORCH_DEBUG_LEVEL = "INFO"


def debug_enabled() -> bool:
    """True when PARAFLOW_DEBUG is set to 1, true, yes or on."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def enable_torch_debug() -> None:
    """Turn on torch's distributed debug output, unless TORCH_DISTRIBUTED_DEBUG is already set.

    torch reads the variable when ``torch.distributed`` is imported, so the level is applied
    again here; call before the process group starts.
    """
    os.environ.setdefault("TORCH_DISTRIBUTED_DEBUG", TORCH_DEBUG_LEVEL)
    torch.distributed.set_debug_level_from_env()


_DESCRIPTOR_BYTES = 512  # the JSON of one call, zero-padded
_MAX_DIMS = 8  # dimensions a descriptor names; more are summed up by their count and element count
_SITE_CHARS = 96


class Call(NamedTuple):
    """One rank's collective as the check compares it and the stall report names it."""

    collective: str
    sequence: int
    dtype: str  # "" without a tensor
    shape: str  # "[2, 3]"
    argument: Any  # the allreduce op, the broadcast source, else None
    site: str

    def __str__(self) -> str:
        if self.collective == "barrier":
            call = "barrier()"
        else:
            arg = {"allreduce": f", op={self.argument}", "broadcast": f", src={self.argument}"}.get(self.collective, "")
            call = f"{self.collective}({self.dtype}{self.shape}{arg})"
        return f"{call} as collective #{self.sequence} at {self.site}"


def _call(collective: str, sequence: int, tensor: Optional[torch.Tensor], argument: Any, site: str) -> Call:
    if tensor is None:
        return Call(collective, sequence, "", "", None, site[:_SITE_CHARS])
    return _recorded_call((collective, sequence, tensor.dtype, tensor.shape, argument, site))


def _recorded_call(record: tuple) -> Call:
    """The Call of a record the collectives keep: (collective, number, dtype or None, shape, argument, site)."""
    collective, sequence, dtype, shape, argument, site = record
    if dtype is None:
        return Call(collective, sequence, "", "", None, site[:_SITE_CHARS])
    dims = list(shape)
    if len(dims) > _MAX_DIMS:
        dims = [*dims[:_MAX_DIMS], f"... {len(dims)} dims, {math.prod(shape)} elements"]
    text = "[" + ", ".join(map(str, dims)) + "]"
    kind = str(dtype).replace("torch.", "")
    return Call(collective, sequence, kind, text, argument if collective != "allgather" else None, site[:_SITE_CHARS])


def call_text(collective: str, sequence: int, tensor: Optional[torch.Tensor], argument: Any, site: str) -> str:
    """The call as the check and the stall report name it: ``allreduce(float32[4], op=sum) as
    collective #3 at train.py:12``; `argument` is the op or the source rank."""
    return str(_call(collective, sequence, tensor, argument, site))


def _encode(call: Call) -> torch.Tensor:
    raw = json.dumps(list(call)).encode()[:_DESCRIPTOR_BYTES]
    return torch.frombuffer(bytearray(raw.ljust(_DESCRIPTOR_BYTES, b"\0")), dtype=torch.uint8)


def _decode(row: torch.Tensor) -> Optional[Call]:
    """The call in a gathered row, or None for bytes that are no descriptor (another collective's)."""
    try:
        return Call(*json.loads(bytes(row.cpu().tolist()).rstrip(b"\0")))
    except (ValueError, TypeError):
        return None


def check_same_call(
    backend: Any, sequence: int, collective: str, tensor: Optional[torch.Tensor], argument: Any, site: str
) -> None:
    """Raise the same CollectiveError on every rank unless all are about to make the same call.

    One allgather of this rank's descriptor through the backend's own ``_allgather``; under
    PARAFLOW_DEBUG each rank also prints the call on stderr first.
    """
    mine = _call(collective, sequence, tensor, argument, site)
    if debug_enabled():
        print(f"[paraflow debug] rank {backend.rank}: {mine}", file=sys.stderr, flush=True)
    calls = [_decode(row) for row in backend._allgather(_encode(mine).to(backend.device))]
    if _mismatch(calls) is not None:
        raise mismatch_error(collective, backend.rank, calls)


_PROBLEMS = (
    ("collective", "ranks called different collectives"),
    ("dtype", "the tensor's dtype differs across ranks"),
    ("shape", "the tensor's shape differs across ranks"),
    ("argument", "ranks passed different arguments"),
    (
        "sequence",
        "ranks have made different numbers of paraflow collectives (a backend created again on some ranks only?)",
    ),
)


def _mismatch(calls: list[Optional[Call]]) -> Optional[str]:
    if None in calls:
        return "a rank is inside a different collective"
    for field, problem in _PROBLEMS:
        if len({getattr(c, field) for c in calls}) > 1:
            return problem
    return None


def describe(calls: list[Optional[Call]]) -> str:
    """Every rank and what it called, ranks with the same call grouped."""
    groups: dict[str, list[int]] = {}
    for rank, call in enumerate(calls):
        text = (
            str(call)
            if call is not None
            else "something that is not a paraflow collective (a raw torch.distributed or horovod call?)"
        )
        groups.setdefault(text, []).append(rank)
    parts = []
    for text, ranks in groups.items():
        parts.append(f"{ranks_text(ranks)} called {text}")
    return "; ".join(parts)


def mismatch_error(collective: str, rank: int, calls: list[Optional[Call]]) -> CollectiveError:
    """The error every rank raises when the calls disagree."""
    problem = _mismatch(calls) or "the ranks' descriptors differ"
    return CollectiveError(
        f"{collective} on rank {rank}: {problem}: {describe(calls)}. Every rank must call the same "
        f"collectives in the same order, with tensors of the same shape and dtype and the same op / src."
    )


# ---------------------------------------------------------------- found after the fact
# Without the check, each rank folds every public collective it makes into a digest (no
# communication: paraflow.core.collectives.fold) and keeps its first and latest calls. The end of the
# job compares the digests in the final barrier's place (one allgather), so a mismatch the library
# let through (gloo's broadcast into a larger tensor completes) still fails the job, naming each
# rank's call; horovod's own mismatch error is completed the same way with every rank's call.
_RECORD_BYTES = 8192  # the JSON of one rank's kept calls, zero-padded


def encode_calls(records: list[tuple]) -> torch.Tensor:
    """The kept calls (records as `_recorded_call` takes them) as a fixed-size byte tensor; the
    oldest are left out when they do not fit."""
    calls = [list(_recorded_call(r)) for r in records]
    raw = json.dumps(calls).encode()
    while len(raw) > _RECORD_BYTES and calls:
        calls.pop(0)
        raw = json.dumps(calls).encode()
    return torch.frombuffer(bytearray(raw.ljust(_RECORD_BYTES, b"\0")), dtype=torch.uint8)


def decode_calls(row: torch.Tensor) -> dict[int, Call]:
    """A rank's kept calls from `encode_calls`'s bytes, by number."""
    try:
        calls = [Call(*c) for c in json.loads(bytes(row.cpu().tolist()).rstrip(b"\0"))]
    except (ValueError, TypeError):
        return {}
    return {c.sequence: c for c in calls}


def recorded_mismatch_error(
    where: str, kept: list[dict[int, Call]], counts: Optional[list[int]] = None, number: Optional[int] = None
) -> CollectiveError:
    """The error every rank raises when the records of its calls (`kept`, by rank) show a mismatch.

    Names call `number`, or else the earliest call number that every rank kept and on which they
    differ; without one, the number of collectives each rank made (`counts`).
    """
    common = sorted(set.intersection(*(set(k) for k in kept))) if kept else []
    if number is not None:
        common = [number] if number in common else []
    for number in common:
        calls = [k[number] for k in kept]
        problem = _mismatch(calls)
        if problem is not None:
            found = f"{problem}: {describe(calls)}"
            break
    else:
        made = "; ".join(
            f"rank {r} made {n} collectives" + (f", last {k[max(k)]}" if k else "")
            for r, (n, k) in enumerate(zip(counts or [max(k, default=0) for k in kept], kept))
        )
        found = (
            f"the ranks' records of their collectives differ ({made}); the first difference is older than "
            f"the calls each rank keeps"
        )
    return CollectiveError(
        f"{where}: {found}. Every rank must call the same collectives in the same order, with tensors of the "
        f"same shape and dtype and the same op / src. PARAFLOW_DEBUG=1 (or paraflow.init(check_collectives=True)) "
        f"makes a mismatch an error at the call."
    )
