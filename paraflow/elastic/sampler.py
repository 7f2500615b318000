"""The elastic sampler: an epoch that goes on at a new world size, every sample once."""

from __future__ import annotations

from collections.abc import Sized
from typing import Any, Optional, Union

from ..training.sampler import ShardSampler

__all__ = ["ElasticSampler"]


class ElasticSampler(ShardSampler):
    """A `paraflow.training.sampler.ShardSampler` that records how far the epoch went and
    deals out the rest of it again when the number of ranks changes.

    Its place is counted in samples of the epoch's permutation over all ranks, so it does not
    depend on the world size: after a membership change (`reset`) or a restore from a
    commit (`load_state_dict`), the samples not yet trained are dealt out among the ranks
    there are now. Every sample of an epoch is trained once, except those of the steps rolled
    back since the last commit, which are trained again. Horovod's ``ElasticSampler`` under the
    same name and calls (``record_batch``, ``set_epoch``).

    Args:
        dataset: the dataset, or its length.
        shuffle: draw a new permutation each epoch (as for ShardSampler).
        seed: base seed, the same on every rank.
        drop_last: leave out the remainder so the shards are equal at every world size (the
            ranks then always run the same number of batches).
        num_replicas: default: the current backend's world size (`paraflow.current`).
        rank: default: the current backend's rank.
    """

    def __init__(
        self,
        dataset: Union[Sized, int],
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
    ) -> None:
        if num_replicas is None or rank is None:
            from ..core.current import current

            backend = current()
            num_replicas = backend.world_size if num_replicas is None else num_replicas
            rank = backend.rank if rank is None else rank
        super().__init__(dataset, num_replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.processed = 0  # samples of this rank's shard trained since `position`

    def set_epoch(self, epoch: int, start: int = 0, position: Optional[int] = None) -> None:
        """Go to epoch `epoch`: the epoch it is in goes on from where it stands, another begins.

        Args:
            epoch: the epoch, which picks the permutation.
            start: as for ShardSampler (per rank; best left 0 here).
            position: samples of the epoch already trained over all ranks; None (default): the
                recorded place when `epoch` is the sampler's epoch, else 0.
        """
        if position is None:
            position = self.place() if int(epoch) == self.epoch else 0
        super().set_epoch(epoch, start=start, position=position)
        self.processed = 0

    def place(self) -> int:
        """Where the epoch stands: samples of its permutation trained over all ranks (the same on
        every rank while they train equal batches; the epoch's end once this rank's shard is done)."""
        if self.processed >= len(self):
            return self._used_length()
        return self.position_after(self.processed)

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Record that this rank trained batches ``0..batch_idx`` of `batch_size` samples of its shard."""
        self.processed = min(len(self), (int(batch_idx) + 1) * int(batch_size))

    def record_samples(self, count: int) -> None:
        """Record `count` more samples of this rank's shard as trained (every rank the same count)."""
        self.processed = min(len(self), self.processed + int(count))

    def reset(self, num_replicas: int, rank: int) -> None:
        """Deal out the rest of the epoch among `num_replicas` ranks; this one is `rank`."""
        position = self.place()
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        super().set_epoch(self.epoch, position=position)
        self.processed = 0

    def state_dict(self) -> dict[str, Any]:
        """The epoch, its place (samples over all ranks) and the settings a restore must share."""
        return {**super().state_dict(), "position": self.place()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go back to the saved epoch and place; refuse a state drawn from different settings."""
        super().load_state_dict(state)
        super().set_epoch(state["epoch"], position=state.get("position", 0))
        self.processed = 0
