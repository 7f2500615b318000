"""Resuming part-way through an epoch under another number of ranks trains each sample once.

train.py saves at 2 ranks part-way through the first epoch and resumes at 1 and at 3 ranks; the
samples the two runs trained in that epoch are the training set exactly once. The sampler's
position is kept in samples over all ranks, so the world size may change; a position kept per
rank resumes only at the world size that wrote it, and anything else is refused.
"""

import json
from pathlib import Path

import pytest
from conftest import ROOT, WORKERS, launch_ok

from paraflow.errors import ConfigurationError
from paraflow.training.sampler import ShardSampler

TRAIN_SET = 3277  # --data synthetic: 4096 samples, a fifth held out
BATCH, STEPS = 32, 20  # 20 steps at 2 ranks: 1,280 samples, part-way through the epoch
LAUNCH = {1: ("python", "single"), 2: ("torchrun", "ddp-gloo"), 3: ("torchrun", "ddp-gloo")}


def trained(directory: Path, nproc: int, *args) -> list:
    directory.mkdir()
    launcher, backend = LAUNCH[nproc]
    argv = ["--backend", backend, "--data", "synthetic", "--batch-size", BATCH, "--epochs", 1, *args]
    launch_ok(launcher, nproc, [WORKERS / "resume_trace.py", directory, *argv], timeout=240)
    return [i for r in range(nproc) for i in json.loads((directory / f"rank{r}.json").read_text())]


@pytest.fixture(scope="module")
def first_half(tmp_path_factory):
    directory = tmp_path_factory.mktemp("first-half")
    checkpoint = directory / "ckpt.pt"
    seen = trained(directory / "trace", 2, "--max-steps", STEPS, "--checkpoint", checkpoint)
    assert len(seen) == len(set(seen)) == STEPS * BATCH * 2
    return checkpoint, seen


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc", [1, 3])
def test_resume_at_another_world_size_trains_every_sample_of_the_epoch_once(first_half, nproc, tmp_path):
    checkpoint, before = first_half
    after = trained(tmp_path / "trace", nproc, "--resume", checkpoint)
    assert len(after) == TRAIN_SET - len(before), f"{len(after)} samples after the resume"
    assert sorted(before + after) == list(range(TRAIN_SET))


@pytest.mark.parametrize("size", [23, 24, 100])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_global_position_resumes_exactly_under_any_world_size(size, drop_last):
    for n_before in (1, 2, 3, 4):
        for per_rank in (0, 1, 3):
            first = [ShardSampler(size, n_before, r, seed=5, drop_last=drop_last) for r in range(n_before)]
            for sampler in first:
                sampler.set_epoch(2)
            done = [i for sampler in first for i in list(sampler)[:per_rank]]
            position = first[0].position_after(per_rank)
            assert position == len(done)
            for n_after in (1, 2, 3, 5):
                rest = [ShardSampler(size, n_after, r, seed=5, drop_last=drop_last) for r in range(n_after)]
                for sampler in rest:
                    sampler.set_epoch(2, position=position)
                left = [i for sampler in rest for i in sampler]
                assert len(done) + len(left) == len(set(done + left))  # nothing twice
                assert sum(s.shard_sizes()[s.rank] for s in rest) == len(left)
                if not drop_last:
                    assert sorted(done + left) == list(range(size))  # nothing left out


def test_train_py_refuses_an_old_per_rank_position(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    import train

    with pytest.raises(ConfigurationError, match="epoch boundary"):
        train.check_progress({"epoch": 1, "batch": 2, "step": 5})
    assert train.check_progress({"epoch": 1, "batch": 0, "step": 5}) == {"epoch": 1, "sample": 0, "step": 5}
