"""Uneven batch counts found before the first step of an epoch, instead of a hang.

``ShardSampler`` gives every sample to exactly one rank per epoch, so shards may differ by one
sample, and with some batch sizes the ranks then run different numbers of batches (449
samples in batches of 112 on 2 ranks: 3 batches against 2). Outside ``backend.join`` that hangs
the rank with more batches in its gradient allreduce, or, on DDP, silently averages gradients of
different steps across epochs. Every rank knows every shard's length without communicating,
so when a DataLoader starts iterating the sampler, each rank works out every rank's batch count
from the loader's ``batch_size`` and ``drop_last``; if they differ, the next training forward
(in ``wrap_model``'s marker, :mod:`paraflow.reliability.activity`) raises the same
ConfigurationError on every rank, naming ``join`` and ``drop_last``. Evaluation loops (no
gradients) are left alone: ranks may score different numbers of batches.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ..reliability.activity import Activity
    from .sampler import ShardSampler

__all__ = ["batch_counts", "uneven_message", "watch_epoch"]


def _loader_batching(sampler: ShardSampler) -> Optional[tuple[int, bool]]:
    """(batch_size, drop_last) of the torch BatchSampler iterating `sampler` right now, if one is."""
    from torch.utils.data import BatchSampler

    frame = sys._getframe(2)
    for _ in range(4):  # ShardSampler.__iter__ is called from BatchSampler.__iter__ (a DataLoader's batching)
        if frame is None:
            return None
        owner = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        if isinstance(owner, BatchSampler) and owner.sampler is sampler:
            return owner.batch_size, owner.drop_last
        frame = frame.f_back
    return None


def batch_counts(lengths: list[int], batch_size: int, drop_last: bool) -> list[int]:
    """Batches each rank runs with these shard lengths."""
    return [n // batch_size if drop_last else math.ceil(n / batch_size) for n in lengths]


def uneven_message(sampler: ShardSampler, lengths: list[int], counts: list[int], batch_size: int) -> str:
    """The error every rank raises: the shards, the batch counts, and the two fixes."""
    left_over = sampler.dataset_length % sampler.num_replicas
    by_rank = ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts[:8])) + (", ..." if len(counts) > 8 else "")
    return (
        f"uneven batch counts: {sampler.dataset_length} samples on {sampler.num_replicas} ranks give shards of "
        f"{max(lengths)} and {min(lengths)} samples, so with batch_size={batch_size} the ranks run different "
        f"numbers of batches this epoch ({by_rank}). A rank that runs out first leaves the others waiting in "
        f"their gradient allreduce (on DDP their gradients would pair with another step's). Either train the "
        f"epoch under `with backend.join(model, optimizer):` (ranks that finish early keep answering), or pass "
        f"drop_last=True to backend.distributed_sampler(...) (equal shards; the {left_over} left-over "
        f"sample(s) change each epoch)."
    )


def watch_epoch(activity: Activity, sampler: ShardSampler, indices: list[int]) -> Iterator[int]:
    """The iterator ``ShardSampler.__iter__`` returns for a backend's sampler.

    Counts the data pass, and while an epoch with uneven batch counts is being iterated, leaves
    its message in ``activity.uneven`` for the next training forward to raise.
    """
    activity.passes += 1
    batching = _loader_batching(sampler)
    if batching is None:
        return iter(indices)
    batch_size, drop_last = batching
    lengths = [max(0, n - sampler.start) for n in sampler.shard_sizes()]
    counts = batch_counts(lengths, batch_size, drop_last)
    if len(set(counts)) == 1:
        return iter(indices)
    return _flagged(activity, uneven_message(sampler, lengths, counts, batch_size), indices)


def _flagged(activity: Activity, message: str, indices: list[int]) -> Iterator[int]:
    key = object()
    activity.uneven[key] = message
    try:
        yield from indices
    finally:
        activity.uneven.pop(key, None)
