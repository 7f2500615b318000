"""Data sharding: each epoch every sample goes to exactly one rank, reshuffled from one seed."""

from collections import Counter

import pytest
from conftest import WORKERS, launch_ok, read_rank_json

import paraflow
from paraflow.training.sampler import ShardSampler

SIZE, EPOCHS = 23, 3  # 23 is odd: two ranks cannot split it evenly


def shards(size, n, epoch=0, drop_last=False, seed=7, shuffle=True):
    out = []
    for rank in range(n):
        sampler = ShardSampler(size, n, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


@pytest.mark.parametrize("size", [0, 1, 7, 23, 24])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_without_drop_last_every_sample_exactly_once(size, n):
    for epoch in range(3):
        parts = shards(size, n, epoch)
        assert sorted(i for part in parts for i in part) == list(range(size))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
        assert [len(p) for p in parts] == ShardSampler(size, n, 0).shard_sizes()


@pytest.mark.parametrize("size", [7, 23, 24])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_with_drop_last_equal_shards_and_no_repeats(size, n):
    dropped = set()
    for epoch in range(6):
        parts = shards(size, n, epoch, drop_last=True)
        ids = [i for part in parts for i in part]
        assert len(ids) == len(set(ids)) == size - size % n
        assert len({len(p) for p in parts}) == 1
        dropped |= set(range(size)) - set(ids)
    if size % n:  # reshuffling leaves out different samples in different epochs
        assert len(dropped) > size % n


def test_reshuffled_per_epoch_and_reproducible_from_the_seed():
    assert shards(SIZE, 2, epoch=0) != shards(SIZE, 2, epoch=1)
    assert shards(SIZE, 2, epoch=1) == shards(SIZE, 2, epoch=1)
    assert shards(SIZE, 2, seed=1) != shards(SIZE, 2, seed=2)
    assert shards(SIZE, 1, shuffle=False) == [list(range(SIZE))]


def test_start_resumes_part_way_through_an_epoch():
    sampler = ShardSampler(SIZE, 2, 1, seed=3)
    sampler.set_epoch(4)
    whole = list(sampler)
    sampler.set_epoch(4, start=5)
    assert list(sampler) == whole[5:] and len(sampler) == len(whole) - 5


def test_state_dict_round_trip_and_mismatch():
    sampler = ShardSampler(SIZE, 2, 0, seed=3)
    sampler.set_epoch(6)
    other = ShardSampler(SIZE, 2, 0, seed=3)
    other.load_state_dict(sampler.state_dict())
    assert other.epoch == 6 and list(other) == list(sampler)
    with pytest.raises(paraflow.ConfigurationError, match="seed"):
        ShardSampler(SIZE, 2, 0, seed=4).load_state_dict(sampler.state_dict())


def test_bad_rank_is_refused():
    with pytest.raises(paraflow.ConfigurationError, match="rank 2"):
        ShardSampler(SIZE, 2, 2)


@pytest.mark.timeout(180)
def test_sample_ids_collected_from_every_rank(tmp_path):
    """The sampler depends on rank and world size only, so one backend stands for all."""
    launch_ok("torchrun", 2, [WORKERS / "sharding.py", "ddp-gloo", tmp_path, SIZE, EPOCHS], timeout=120)
    ranks = read_rank_json(tmp_path, 2)
    for epoch in range(EPOCHS):
        exact = [r["false"][epoch] for r in ranks]
        assert Counter(i for ids in exact for i in ids) == Counter(range(SIZE)), f"epoch {epoch}"
        kept = [r["true"][epoch] for r in ranks]
        assert len(kept[0]) == len(kept[1]) == SIZE // 2
        assert len(set(kept[0]) | set(kept[1])) == 2 * (SIZE // 2)
    # Reshuffled: each rank sees a different order (and mostly different samples) every epoch.
    for r in ranks:
        assert len({tuple(ids) for ids in r["false"]}) == EPOCHS
