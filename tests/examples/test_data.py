"""The digits data: the same tensors from scikit-learn and from the cache that spares its import."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from paraflow.examples.data import digits_cache_path, load_dataset

pytest.importorskip("sklearn", reason="the digits data needs scikit-learn: pip install 'paraflow[data]'")

LOAD_TWICE = """
import sys, torch
from paraflow.examples.data import load_dataset
train, test = load_dataset("digits", seed=3)
torch.save((train.tensors, test.tensors, "sklearn" in sys.modules), sys.argv[1])
"""


def _load_in_a_new_process(tmp_path, name):
    out = tmp_path / name
    subprocess.run([sys.executable, "-c", LOAD_TWICE, str(out)], check=True, timeout=120)
    return torch.load(out, weights_only=True)


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_second_load_reads_the_cache_without_scikit_learn_and_gives_the_same_data(tmp_path, cache_home):
    first_train, first_test, first_imported = _load_in_a_new_process(tmp_path, "first.pt")
    assert digits_cache_path() == cache_home / "paraflow" / "digits.pt" and digits_cache_path().exists()
    second_train, second_test, second_imported = _load_in_a_new_process(tmp_path, "second.pt")
    assert first_imported and not second_imported
    for a, b in zip([*first_train, *first_test], [*second_train, *second_test]):
        assert torch.equal(a, b)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.cat([first_train[0], first_test[0]]).reshape(len(bunch.target), 64)
    assert sorted(map(tuple, (images * 16).tolist())) == sorted(map(tuple, bunch.data.tolist()))


def test_a_damaged_cache_is_loaded_again_and_replaced(cache_home):
    path = digits_cache_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a tensor file")
    train, test = load_dataset("digits")
    assert len(train) + len(test) == 1797
    pixels, labels = torch.load(path, weights_only=True)
    assert pixels.shape == (1797, 64) and labels.shape == (1797,)


def test_a_cache_that_cannot_be_written_still_gives_the_data(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # the cache directory would be inside a file
    train, test = load_dataset("digits")
    assert len(train) + len(test) == 1797 and not digits_cache_path().exists()


def test_a_write_that_fails_midway_leaves_no_partial_file_and_still_gives_the_data(cache_home, monkeypatch):
    def fail_midway(obj, path):  # as torch.save's writer fails on a full disk
        Path(path).write_bytes(b"half a file")
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(torch, "save", fail_midway)
    train, test = load_dataset("digits")
    assert len(train) + len(test) == 1797
    assert list((cache_home / "paraflow").iterdir()) == []
