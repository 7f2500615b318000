"""Data parallelism must not change the maths: 2 ranks end where one process on the whole batch ends."""

import pytest
import torch

from conftest import WORKERS, launch_ok

SCRIPT = WORKERS / "equivalence.py"


def train(tmp_path, backend, launcher, nproc, accumulation=1):
    out = tmp_path / f"{backend}-{launcher}-{nproc}-{accumulation}.pt"
    launch_ok(launcher, nproc, [SCRIPT, backend, out, accumulation], timeout=180)
    return torch.load(out)


def assert_same_parameters(a, b):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-10, atol=1e-12, msg=key)


@pytest.mark.timeout(300)
def test_ddp_gloo_two_ranks_matches_single_on_whole_batch(tmp_path):
    reference = train(tmp_path, "single", "python", 1)
    assert_same_parameters(train(tmp_path, "ddp-gloo", "torchrun", 2), reference)


@pytest.mark.timeout(300)
def test_ddp_no_sync_accumulation_matches_single(tmp_path):
    reference = train(tmp_path, "single", "python", 1)
    assert_same_parameters(train(tmp_path, "ddp-gloo", "torchrun", 2, accumulation=2), reference)


@pytest.mark.timeout(300)
def test_training_actually_moves_parameters(tmp_path):
    """Guards the comparison above: a run that did nothing would also 'match'."""
    from paraflow.models import build_model
    torch.manual_seed(1234)
    initial = build_model("mlp", width=16).double().state_dict()
    trained = train(tmp_path, "single", "python", 1)
    assert any(not torch.allclose(initial[k], trained[k]) for k in initial if initial[k].is_floating_point())
