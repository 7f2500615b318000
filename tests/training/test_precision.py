"""Mixed precision: one `precision` option, torch.autocast plus a gradient scaler, on every backend."""

import json

import pytest
import torch
from conftest import ROOT, launch_ok, requires_gpu, requires_horovod

import paraflow

TRAIN = ROOT / "train.py"


def run_train(tmp_path, backend, launcher, nproc, *flags, name="run"):
    out, checkpoint = tmp_path / f"{name}.json", tmp_path / f"{name}.pt"
    launch_ok(
        launcher,
        nproc,
        [TRAIN, "--backend", backend, "--json-out", out, "--checkpoint", checkpoint, *flags],
        timeout=180,
    )
    return json.loads(out.read_text()), torch.load(checkpoint, weights_only=True)["state"]


@pytest.mark.timeout(240)
def test_bf16_autocast_on_cpu_trains_through_train_py(tmp_path):
    summary, _ = run_train(tmp_path, "single", "python", 1, "--precision", "bf16", "--epochs", "8")
    assert summary["precision"] == "bf16" and summary["device"] == "cpu"
    assert summary["compute_dtype"] == "bfloat16"  # the model's output really came out of autocast
    assert summary["accuracy"] >= 0.9, summary


@pytest.mark.timeout(240)
def test_fp16_with_loss_scaling_keeps_the_scaler_in_the_checkpoint(tmp_path):
    summary, state = run_train(
        tmp_path, "single", "python", 1, "--precision", "fp16", "--data", "synthetic", "--max-steps", "5"
    )
    assert summary["compute_dtype"] == "float16"
    assert state["scaler"]["scale"] > 0 and "_growth_tracker" in state["scaler"]


@pytest.mark.timeout(300)
@requires_horovod
def test_fp16_loss_scaling_gives_horovod_and_ddp_the_same_model(tmp_path):
    """Horovod reduces gradients inside optimizer.step(): the scaler must wait for that reduction
    before it unscales them, or the update uses still-scaled (or half-reduced) gradients."""
    flags = ("--precision", "fp16", "--data", "synthetic", "--batch-size", "256", "--max-steps", "6")
    _, ddp = run_train(tmp_path, "ddp-gloo", "torchrun", 2, *flags, name="ddp")
    _, horovod = run_train(tmp_path, "horovod", "mpirun", 2, *flags, name="horovod")
    for key, value in ddp["model"].items():
        torch.testing.assert_close(horovod["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    assert horovod["scaler"]["scale"] == ddp["scaler"]["scale"]


@requires_gpu
@pytest.mark.timeout(240)
def test_fp16_with_loss_scaling_on_cuda(tmp_path):
    summary, state = run_train(tmp_path, "single", "python", 1, "--precision", "fp16", "--epochs", "8")
    assert summary["device"].startswith("cuda") and summary["compute_dtype"] == "float16"
    assert summary["accuracy"] >= 0.9 and state["scaler"]["scale"] > 0


@pytest.mark.parametrize(
    "precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)]
)
def test_autocast_and_scaler_follow_the_option(precision, dtype):
    with paraflow.init("single", precision=precision, num_threads=1) as backend:
        layer = backend.wrap_model(torch.nn.Linear(4, 4))
        with backend.autocast():
            assert layer(torch.ones(2, 4)).dtype == dtype
        assert backend.grad_scaler().is_enabled() == (precision == "fp16")


def test_unknown_precision_lists_the_choices():
    with pytest.raises(paraflow.ConfigurationError, match="fp32, bf16, fp16"):
        paraflow.get_backend("single", precision="fp8")
