"""GPU-only checks; they skip with a reason on a host without CUDA."""

import pytest
import torch
from conftest import ROOT, launch_ok, requires_gpu
from torch import nn

import paraflow


@requires_gpu
def test_ddp_nccl_at_one_rank_trains_and_reduces(tmp_path):
    with paraflow.init("ddp-nccl") as backend:
        assert backend.device.type == "cuda" and backend.transport == "nccl"
        x = torch.tensor([1.0, 2.0])  # CPU input: moved to the GPU for NCCL and back
        assert backend.allreduce(x, "sum").tolist() == [1.0, 2.0]
        model = backend.wrap_model(nn.Linear(4, 2))
        model(torch.randn(3, 4, device=backend.device)).sum().backward()
        assert next(model.parameters()).grad.is_cuda


@requires_gpu
def test_dp_on_gpu_wraps_every_visible_device():
    with paraflow.init("dp") as backend:
        model = backend.wrap_model(nn.Linear(4, 2))
        assert isinstance(model, nn.DataParallel)
        assert model.device_ids == list(range(torch.cuda.device_count()))
        assert model(torch.randn(8, 4, device="cuda")).shape == (8, 2)


@requires_gpu
@pytest.mark.timeout(300)
def test_train_script_on_gpu(tmp_path):
    import json

    for backend in ("ddp-nccl", "dp"):
        out = tmp_path / f"{backend}.json"
        launch_ok("python", 1, [ROOT / "train.py", "--backend", backend, "--json-out", out], timeout=240)
        summary = json.loads(out.read_text())
        assert summary["device"].startswith("cuda") and summary["accuracy"] >= 0.95
