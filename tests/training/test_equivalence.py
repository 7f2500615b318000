"""Data parallelism must not change the maths: 2 ranks end where one process on the whole batch ends."""

import pytest
import torch
from conftest import WORKERS, launch_ok, requires_horovod

# Its tests share launches (a module-scoped fixture): under `pytest -n 2 --dist loadgroup` they stay in one process.
pytestmark = pytest.mark.xdist_group("equivalence")

SCRIPT = WORKERS / "equivalence.py"


def train(tmp_path, backend, launcher, nproc, accumulation=1, mode="no_sync"):
    out = tmp_path / f"{backend}-{launcher}-{nproc}-{accumulation}-{mode}.pt"
    launch_ok(launcher, nproc, [SCRIPT, backend, out, accumulation, mode], timeout=180)
    return torch.load(out)


def assert_same_parameters(a, b):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-10, atol=1e-12, msg=key)


@pytest.fixture(scope="module")
def ddp_gloo(tmp_path_factory):
    """ddp-gloo on 2 ranks, trained once for the tests that compare with it."""
    return train(tmp_path_factory.mktemp("ddp-gloo"), "ddp-gloo", "torchrun", 2)


@pytest.mark.timeout(300)
def test_ddp_gloo_two_ranks_matches_single_on_whole_batch(ddp_gloo, float64_reference):
    assert_same_parameters(ddp_gloo, float64_reference)


@pytest.mark.timeout(300)
def test_ddp_no_sync_accumulation_matches_single(tmp_path, float64_reference):
    assert_same_parameters(train(tmp_path, "ddp-gloo", "torchrun", 2, accumulation=2), float64_reference)


@pytest.mark.timeout(300)
def test_training_actually_moves_parameters(float64_reference):
    """Guards the comparison above: a run that did nothing would also 'match'."""
    from paraflow.examples.models import build_model

    torch.manual_seed(1234)
    initial = build_model("mlp", width=16).double().state_dict()
    trained = float64_reference
    assert any(not torch.allclose(initial[k], trained[k]) for k in initial if initial[k].is_floating_point())


@requires_horovod
@pytest.mark.timeout(300)
def test_horovod_two_ranks_matches_ddp_gloo_and_single(tmp_path, float64_reference, ddp_gloo):
    horovod = train(tmp_path, "horovod", "mpirun", 2)
    assert_same_parameters(horovod, float64_reference)
    assert_same_parameters(horovod, ddp_gloo)


@requires_horovod
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "launcher, mode",
    [("horovodrun", "no_sync"), ("mpirun", "option")],
    ids=["no_sync-horovodrun", "accumulation_steps-mpirun"],
)
def test_horovod_gradient_accumulation_matches_single(tmp_path, float64_reference, launcher, mode):
    trained = train(tmp_path, "horovod", launcher, 2, accumulation=2, mode=mode)
    assert_same_parameters(trained, float64_reference)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "backend, launcher", [("ddp-gloo", "torchrun"), pytest.param("horovod", "mpirun", marks=requires_horovod)]
)
def test_accumulate_matches_one_step_on_the_whole_batch(tmp_path, float64_reference, backend, launcher):
    """4 micro-batches of b rows per rank under backend.accumulate equal one step on 4b rows per rank.

    The worker also checks that only the 4th micro-batch's backward sends gradients.
    """
    trained = train(tmp_path, backend, launcher, 2, accumulation=4, mode="accumulate")
    assert_same_parameters(trained, float64_reference)
