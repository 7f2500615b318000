"""The elastic sampler's accounting: across a world-size change, every sample of an epoch is trained
once, except those of the steps rolled back since the last commit (trained twice)."""

from __future__ import annotations

import collections

import pytest

from paraflow.elastic import ElasticSampler

N, BATCH = 103, 4


def ranks(world: int, drop_last: bool, epoch: int = 0) -> list:
    samplers = [ElasticSampler(N, seed=5, drop_last=drop_last, num_replicas=world, rank=r) for r in range(world)]
    for s in samplers:
        s.set_epoch(epoch)
    return samplers


def train_steps(samplers: list, steps: int, seen: collections.Counter) -> None:
    """Every rank trains `steps` more batches of its shard (in step, as ranks do)."""
    shards = [s.indices() for s in samplers]
    done = [s.processed for s in samplers]
    for step in range(steps):
        for s, shard, first in zip(samplers, shards, done):
            batch = shard[first + step * BATCH : first + (step + 1) * BATCH]
            seen.update(batch)
            s.record_samples(len(batch))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (3, 2)])
def test_a_lost_worker_retrains_the_rolled_back_steps_only(before, after, drop_last):
    seen: collections.Counter = collections.Counter()
    old = ranks(before, drop_last, epoch=3)
    train_steps(old, 3, seen)
    committed = [s.state_dict() for s in old]
    assert len({c["position"] for c in committed}) == 1, "the ranks must agree on where the epoch stands"
    rolled_back: collections.Counter = collections.Counter()
    train_steps(old, 2, rolled_back)  # trained, then lost with the worker
    seen.update(rolled_back)
    # The survivors restore the commit and deal out the rest of the epoch at the new size.
    new = [ElasticSampler(N, seed=5, drop_last=drop_last, num_replicas=before, rank=r % before) for r in range(after)]
    for s in new:
        s.load_state_dict(committed[0])
    for r, s in enumerate(new):
        s.reset(after, r)
        s.set_epoch(3)  # the loop enters the same epoch again: it goes on where it stood
    rest = [i for s in new for i in s.indices()]
    seen.update(rest)
    kept = set(range(N)) if not drop_last else set(seen)
    assert set(seen) == kept
    if drop_last:
        assert len(kept) >= N - max(before, after) + 1
    twice = {i for i, c in seen.items() if c == 2}
    assert twice == set(rolled_back), "only the rolled-back steps' samples are trained twice"
    assert all(c <= 2 for c in seen.values())
    assert sum(len(s) for s in new) == len(rest)


def test_hosts_changed_without_rollback_every_sample_once():
    seen: collections.Counter = collections.Counter()
    old = ranks(2, drop_last=False)
    train_steps(old, 4, seen)
    for r, s in enumerate(old[:1]):  # one host left; the survivor goes on from where it stands
        s.reset(1, r)
    seen.update(old[0].indices())
    assert sorted(seen) == list(range(N)) and set(seen.values()) == {1}


def test_a_new_epoch_starts_at_its_beginning_and_the_end_of_an_epoch_agrees():
    a, b = ranks(2, drop_last=False)
    a.record_batch(len(a), 1), b.record_batch(len(b), 1)  # shards of 52 and 51: both done
    assert a.state_dict()["position"] == b.state_dict()["position"] == N
    a.set_epoch(1)
    assert a.position == 0 and len(a) == 52


def test_a_restore_refuses_other_settings():
    s = ElasticSampler(N, seed=5, num_replicas=1, rank=0)
    other = ElasticSampler(N, seed=6, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="seed"):
        s.load_state_dict(other.state_dict())
