"""Checkpoints: atomic writes that survive a crash or a full disk, exact round trips, clear errors."""

import errno
import os
import random

import numpy as np
import pytest
import torch
from conftest import WORKERS, launch

import paraflow
import paraflow.training.checkpoint
from paraflow.training.sampler import ShardSampler


@pytest.fixture
def backend():
    with paraflow.init("single", num_threads=1) as b:
        yield b


def make_training_state(backend, seed=0):
    torch.manual_seed(seed)
    model = backend.wrap_model(torch.nn.Linear(4, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** (8 + seed))
    sampler = ShardSampler(10, 1, 0, seed=3)
    sampler.set_epoch(4 + seed)
    return {
        "model": model,
        "optimizer": optimizer,
        "scaler": scaler,
        "sampler": sampler,
        "epoch": 4 + seed,
        "step": 40 + seed,
    }


def temp_files(directory):
    return [name for name in os.listdir(directory) if name.endswith(".tmp")]


def test_round_trip_restores_every_object_and_the_rng(backend, tmp_path):
    path = tmp_path / "ckpt.pt"
    saved = make_training_state(backend, seed=0)
    backend.save(path, saved)
    expected_draws = (torch.rand(3), random.random(), np.random.rand())

    fresh = make_training_state(backend, seed=1)  # different weights, step count, scale, epoch
    torch.manual_seed(99), random.seed(99), np.random.seed(99)
    rest = backend.load(path, fresh)

    for key, value in saved["model"].state_dict().items():
        assert torch.equal(fresh["model"].state_dict()[key], value)
    a, b = fresh["optimizer"].state_dict()["state"], saved["optimizer"].state_dict()["state"]
    assert all(torch.equal(a[p][k], b[p][k]) for p in b for k in b[p])
    assert fresh["scaler"].get_scale() == saved["scaler"].get_scale()
    assert fresh["sampler"].epoch == 4
    assert (fresh["epoch"], fresh["step"]) == (4, 40) and rest == {"epoch": 4, "step": 40}
    draws = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(draws[0], expected_draws[0]) and draws[1:] == expected_draws[1:]
    assert temp_files(tmp_path) == []


def test_model_is_stored_unwrapped(backend, tmp_path):
    wrapped = torch.nn.DataParallel(torch.nn.Linear(2, 2))  # a wrapper with .module, like DDP
    backend.save(tmp_path / "c.pt", {"model": wrapped})
    stored = paraflow.training.checkpoint.torch.load(tmp_path / "c.pt", weights_only=True)["state"]["model"]
    assert set(stored) == {"weight", "bias"}


def test_failure_mid_write_keeps_the_previous_checkpoint(backend, tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    backend.save(path, {"version": 1, "weights": torch.ones(8)})
    before = path.read_bytes()

    def half_then_disk_full(payload, f):
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(paraflow.training.checkpoint, "_serialize", half_then_disk_full)
    with pytest.raises(paraflow.CheckpointError, match="No space left on device.*previous file.*intact"):
        backend.save(path, {"version": 2, "weights": torch.zeros(8)})

    assert path.read_bytes() == before
    assert backend.load(path)["version"] == 1
    assert temp_files(tmp_path) == []


@pytest.mark.timeout(120)
def test_process_killed_mid_write_leaves_the_previous_checkpoint_loadable(backend, tmp_path):
    path = tmp_path / "ckpt.pt"
    result = launch("python", 1, [WORKERS / "checkpoint_crash.py", "kill", path], timeout=90)
    assert result.returncode == -9, result.stderr[-2000:]
    assert len(temp_files(tmp_path)) == 1  # the half-written file, never renamed
    assert backend.load(path)["version"] == 1
    backend.save(path, {"version": 3})  # the next good save clears the leftover
    assert temp_files(tmp_path) == [] and backend.load(path)["version"] == 3


@pytest.mark.timeout(120)
def test_write_refused_by_the_file_system_keeps_the_previous_checkpoint(backend, tmp_path):
    path = tmp_path / "ckpt.pt"
    result = launch("python", 1, [WORKERS / "checkpoint_crash.py", "full", path], timeout=90)
    assert result.returncode == 0 and "save failed" in result.stdout, result.stdout + result.stderr[-2000:]
    loaded = backend.load(path)
    assert loaded["version"] == 1 and torch.equal(loaded["weights"], torch.ones(256))
    assert temp_files(tmp_path) == []


def test_only_rank_zero_writes(backend, tmp_path, monkeypatch):
    monkeypatch.setattr(type(backend), "is_main", property(lambda self: False))
    backend.save(tmp_path / "ckpt.pt", {"step": 1})
    assert os.listdir(tmp_path) == []


def test_missing_file_is_a_clear_error(backend, tmp_path):
    with pytest.raises(paraflow.CheckpointError, match="could not read checkpoint .*nope.pt"):
        backend.load(tmp_path / "nope.pt", {})


def test_missing_entry_and_wrong_shape_are_clear_errors(backend, tmp_path):
    backend.save(tmp_path / "c.pt", {"model": torch.nn.Linear(4, 3)})
    with pytest.raises(paraflow.ConfigurationError, match="no entry 'optimizer'"):
        backend.load(tmp_path / "c.pt", {"optimizer": torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1)})
    with pytest.raises(paraflow.ConfigurationError, match="entry 'model' does not fit"):
        backend.load(tmp_path / "c.pt", {"model": torch.nn.Linear(5, 3)})


def test_a_file_that_is_not_a_checkpoint_is_refused(backend, tmp_path):
    torch.save({"weight": torch.ones(1)}, tmp_path / "plain.pt")
    with pytest.raises(paraflow.CheckpointError, match="not a paraflow checkpoint"):
        backend.load(tmp_path / "plain.pt")


def test_atomic_write_creates_the_directory_with_normal_permissions(tmp_path):
    target = tmp_path / "new" / "file.bin"
    paraflow.training.checkpoint.atomic_write(str(target), lambda f: f.write(b"abc"))
    assert target.read_bytes() == b"abc"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
