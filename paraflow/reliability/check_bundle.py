"""The check inside the collective: a repeated mid-sized allreduce carries every rank's descriptor.

Over gloo a message of a few KB costs about what a 1 MB allreduce does (the round trip, not the
bytes, dominates on a CPU host), so a separate check frame doubled the cost of a 1 MB allreduce
even when started beside it. Once every rank has agreed on the same allreduce three times in a
row (a training loop, a sweep), the next checked call of every rank is that allreduce with room
for the check: the payload, then one slot per rank holding that rank's descriptor as one byte
per element (exact in every dtype used here), the other ranks' slots neutral for the op (0 for
sum and max, 255 for min). Every rank decides this from what all ranks agreed before, so all run
the same collective whatever each is about to call: a rank whose call differs sends zeros and its
own descriptor. After it every rank reads every descriptor:

- all equal to the repeated call: the payload is the result, in one collective;
- all equal to each other but a different call: nothing is wrong; the call runs the usual way;
- otherwise every rank raises the same CollectiveError, as the frame check does.

A miss costs one wasted collective of the repeated size. Only gloo on the CPU bundles (DDP's
process group, horovod's gloo controller), where a mean is computed exactly as the unbundled
call computes it: DDP's as a sum then a division here, horovod's by its own Average (a sum,
then the whole buffer scaled by 1/n: each slot then holds byte / n, rounded back after; float32
and float64 only). Only for sizes up to BUNDLE_MAX_BYTES: above, copying the payload costs more
than the overlapped frame.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .collective_check import _COMPARED_BYTES, _DESCRIPTOR_BYTES, _PACK, _Descriptor, mismatch_error

__all__ = [
    "BUNDLE_MAX_BYTES",
    "BUNDLE_AFTER",
    "repeated_call",
    "bundle_spec",
    "bundled",
    "note_agreed",
    "forget_agreed",
]

BUNDLE_MAX_BYTES = 2 * 2**20
#: Agreements in a row on the same allreduce before the next call is bundled.
BUNDLE_AFTER = 3
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32)
_NEUTRAL = {"sum": 0, "mean": 0, "max": 0, "min": 255}
#: Where the library's mean scales the whole buffer (horovod), the slots hold byte / n: kept exact
#: enough to round back only in these.
_SCALED_DTYPES = (torch.float32, torch.float64)


def note_agreed(backend, key: tuple, spec: Optional[tuple]) -> None:
    """Record a call every rank agreed on (`spec`: collective, dtype, shape, op, src; None for a barrier)."""
    state = getattr(backend, "_agreed_run", None)
    count = state[2] + 1 if state is not None and state[0] == key else 1
    backend._agreed_run = (key, spec, count)


def forget_agreed(backend) -> None:
    backend._agreed_run = None


def repeated_call(backend) -> Optional[tuple]:
    """(key, spec) of the call every rank agreed on BUNDLE_AFTER times in a row, or None (also for
    barriers): the same on every rank."""
    state = getattr(backend, "_agreed_run", None)
    if state is None or state[1] is None or state[2] < BUNDLE_AFTER:
        return None
    return state[0], state[1]


def bundle_spec(backend, carry_bytes: int) -> Optional[tuple]:
    """(key, spec) of the allreduce every rank bundles next, or None: the same decision on every rank."""
    repeated = repeated_call(backend)
    if repeated is None or not getattr(backend, "_bundles_checks", False):
        return None
    collective, dtype, shape, op, _ = repeated[1]
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    if collective != "allreduce" or dtype not in _DTYPES or not carry_bytes < nbytes <= BUNDLE_MAX_BYTES:
        return None
    if op == "mean" and getattr(backend, "_mean_scales_buffer", False) and dtype not in _SCALED_DTYPES:
        return None  # a descriptor byte / n must come back exactly from the slot
    return repeated


def bundled(
    backend, spec: tuple, words: list, tensor: Optional[torch.Tensor], reuse: bool = False
) -> Optional[Callable]:
    """Run `spec`'s allreduce carrying every rank's descriptor (`words`); `tensor` is this rank's
    payload when its call is the repeated one, else None. Returns the result's getter if every
    rank made that call, None if they all agree on another one (run it the usual way), else raises.
    `reuse`: the caller copies the result out before its next collective (``allreduce_``), so the
    bundle's buffer is kept for the next call instead of allocated anew."""
    _, dtype, shape, op, _ = spec
    numel = torch.Size(shape).numel()
    n, rank = backend.world_size, backend.rank
    length = numel + n * _DESCRIPTOR_BYTES
    buffer = getattr(backend, "_bundle_buffer", None) if reuse else None
    if buffer is None or buffer.numel() != length or buffer.dtype != dtype:
        buffer = torch.empty(length, dtype=dtype, device=backend.device)  # fresh pages cost as much as a copy
        if reuse:
            backend._bundle_buffer = buffer
    if tensor is not None:
        buffer[:numel].copy_(tensor.detach().reshape(-1))
    else:
        buffer[:numel].zero_()
    buffer[numel:].fill_(_NEUTRAL[op])
    mine = bytearray(_DESCRIPTOR_BYTES)
    _PACK.pack_into(mine, 0, *words)
    start = numel + rank * _DESCRIPTOR_BYTES
    buffer[start : start + _DESCRIPTOR_BYTES] = torch.frombuffer(mine, dtype=torch.uint8).to(dtype)
    scaled = op == "mean" and getattr(backend, "_mean_scales_buffer", False)  # the library's own mean
    result = backend._start_allreduce(buffer, op if scaled or op != "mean" else "sum")()
    slots = result[numel:].view(n, _DESCRIPTOR_BYTES)
    rows = (slots * n).round().to(torch.uint8) if scaled else slots.to(torch.uint8)
    first = rows[0, :_COMPARED_BYTES]
    if all(torch.equal(row[:_COMPARED_BYTES], first) for row in rows[1:]):
        if tensor is None:
            return None  # every rank made the same other call
        payload = result[:numel]
        if op == "mean" and not scaled:
            payload.div_(n)
        return lambda: payload.view(shape)
    descriptors = [_Descriptor(list(_PACK.unpack(bytes(row.tolist())))) for row in rows]
    collective = _Descriptor(list(words)).collective
    raise mismatch_error(collective, rank, descriptors)
