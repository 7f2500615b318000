"""fsdp must not change the maths: 2 sharded ranks end where ddp-gloo on 2 ranks and one process on the
whole batch end (float64), with and without gradient accumulation; compression is the reduce dtype."""

import pytest
import torch
from conftest import WORKERS, launch_ok

EQUIVALENCE = WORKERS / "equivalence.py"


def train(tmp_path, backend, launcher, nproc, accumulation=1, mode="no_sync", options=""):
    out = tmp_path / f"{backend}-{nproc}-{accumulation}-{mode}.pt"
    launch_ok(launcher, nproc, [EQUIVALENCE, backend, out, accumulation, mode, options], timeout=180)
    return torch.load(out)


def assert_same_parameters(a, b):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-10, atol=1e-12, msg=key)


@pytest.mark.timeout(300)
def test_fsdp_two_ranks_matches_ddp_gloo_and_single_and_moves_the_parameters(tmp_path, float64_reference):
    # Every Linear its own unit: three all-gathers and reduce-scatters per step, not one.
    fsdp = train(tmp_path, "fsdp", "torchrun", 2, options="blocks=Linear")
    assert_same_parameters(fsdp, float64_reference)
    assert_same_parameters(fsdp, train(tmp_path, "ddp-gloo", "torchrun", 2))
    from paraflow.examples.models import build_model

    torch.manual_seed(1234)
    initial = build_model("mlp", width=16).double().state_dict()
    assert all(not torch.allclose(initial[k], fsdp[k]) for k in initial)


@pytest.mark.timeout(300)
def test_fsdp_accumulate_matches_one_step_on_the_whole_batch(tmp_path, float64_reference):
    """4 micro-batches under backend.accumulate equal one step on 4x the rows; the worker also counts
    FSDP's gradient reduce-scatters, so a micro-batch that communicates fails."""
    trained = train(tmp_path, "fsdp", "mpirun", 2, accumulation=4, mode="accumulate")  # another launcher
    assert_same_parameters(trained, float64_reference)


@pytest.mark.timeout(300)
def test_fsdp_fp16_compression_reduces_in_16_bits(tmp_path, float64_reference):
    """compression='fp16' is FSDP's reduce dtype: within fp16's precision of the float64 run, and not equal."""
    compressed = train(tmp_path, "fsdp", "torchrun", 2, options="compression=fp16")
    largest = max((compressed[k] - float64_reference[k]).abs().max().item() for k in compressed)
    assert 0 < largest < torch.finfo(torch.float16).eps / 10
