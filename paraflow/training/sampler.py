"""Exact data sharding: every sample goes to exactly one rank per epoch, reshuffled each epoch."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any, Union

import torch
from torch.utils.data import Sampler

from ..errors import ConfigurationError

__all__ = ["ShardSampler"]


class ShardSampler(Sampler[int]):
    """This rank's share of a dataset's indices, with no sample repeated or left out.

    Each epoch one permutation of ``range(len(dataset))`` is drawn from ``seed + epoch`` (the same
    on every rank, no communication) and dealt out like cards: rank ``r`` takes positions
    ``r, r + n, r + 2n, ...``. Unlike torch's ``DistributedSampler`` nothing is repeated to pad
    the shards, so an epoch covers every sample exactly once.

    Args:
        dataset: the dataset, or its length.
        num_replicas: number of ranks sharing it.
        rank: this rank, ``0 <= rank < num_replicas``.
        shuffle: draw a new permutation each epoch; False keeps index order.
        seed: base seed; must be the same on every rank.
        drop_last: False (default): every sample once per epoch, so shard lengths may differ by
            one (train under ``backend.join`` or the ranks may run different numbers of batches);
            True: the last ``len(dataset) % num_replicas`` positions of each epoch's permutation
            are left out, so every shard has the same length and every kept sample is seen once
            (with shuffling, a different few are left out each epoch).
    """

    def __init__(
        self,
        dataset: Union[Sized, int],
        num_replicas: int,
        rank: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        size = dataset if isinstance(dataset, int) else len(dataset)
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ConfigurationError(f"rank {rank} is not in 0..{num_replicas - 1} (num_replicas={num_replicas}).")
        if size < 0:
            raise ConfigurationError(f"dataset length must not be negative, got {size}.")
        self.dataset_length = size
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.epoch = 0
        self.start = 0
        self.position = 0

    def set_epoch(self, epoch: int, start: int = 0, position: int = 0) -> None:
        """Use epoch `epoch`'s permutation, from `position` on; skip this rank's first `start` indices.

        Args:
            epoch: the epoch, which picks the permutation.
            start: indices of this rank's shard to skip (per rank: resumes exactly only under
                the world size that counted them).
            position: samples of the epoch's permutation already trained, over all ranks (from
                `position_after`): the rest is dealt out among the current ranks, so an
                epoch resumes exactly under any world size.
        """
        if start < 0 or position < 0:
            raise ConfigurationError(f"start and position must not be negative, got {start} and {position}.")
        self.epoch = int(epoch)
        self.start = int(start)
        self.position = int(position)

    def position_after(self, samples_per_rank: int) -> int:
        """The epoch's position (samples over all ranks) once every rank has trained `samples_per_rank`
        more of its indices; save it, and resume with ``set_epoch(epoch, position=...)``.

        Exact while the ranks go in step (mid-epoch, equal batches); at the end of an epoch start
        the next one at position 0.
        """
        return min(self._used_length(), self.position + self.num_replicas * (self.start + int(samples_per_rank)))

    def _used_length(self) -> int:
        """Where the part of the permutation dealt out ends (drop_last: so that the shards are equal)."""
        if self.drop_last:
            return self.dataset_length - max(0, self.dataset_length - self.position) % self.num_replicas
        return self.dataset_length

    def shard_sizes(self) -> list[int]:
        """Number of indices each rank gets this epoch from ``position`` on (before any ``start`` skip), by rank."""
        used, n = max(0, self._used_length() - self.position), self.num_replicas
        return [used // n + (1 if r < used % n else 0) for r in range(n)]

    def indices(self) -> list[int]:
        """This rank's indices for the current epoch, after the ``start`` skip."""
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.dataset_length, generator=g)
        else:
            order = torch.arange(self.dataset_length)
        order = order[self.position : self._used_length()]
        return order[self.rank :: self.num_replicas][self.start :].tolist()

    #: Set by ``backend.distributed_sampler``: (sampler, indices) -> iterator, checks batch counts (shard_check).
    on_iteration = None

    def __iter__(self) -> Iterator[int]:
        if self.on_iteration is not None:
            return self.on_iteration(self, self.indices())
        return iter(self.indices())

    def __len__(self) -> int:
        return max(0, self.shard_sizes()[self.rank] - self.start)

    def state_dict(self) -> dict[str, Any]:
        """The epoch and the settings a resumed run must share."""
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "dataset_length": self.dataset_length,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the saved epoch; refuse a checkpoint drawn from different settings."""
        for key in ("seed", "shuffle", "drop_last", "dataset_length"):
            if key in state and state[key] != getattr(self, key):
                raise ConfigurationError(
                    f"the checkpoint's sampler had {key}={state[key]!r} but this one has "
                    f"{key}={getattr(self, key)!r}; resume with the same data and seed."
                )
        self.set_epoch(state["epoch"])
