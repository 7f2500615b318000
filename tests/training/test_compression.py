"""Gradient compression: one option, torch's DDP hooks or horovod's compressors, or a clear refusal."""

import pytest
import torch
from conftest import WORKERS, launch_ok, requires_horovod

import paraflow

# The worker trains float64; these runs send gradients as 16-bit floats instead.
EPS = {"fp16": torch.finfo(torch.float16).eps, "bf16": torch.finfo(torch.bfloat16).eps}


def compressed_run(tmp_path, backend, launcher, compression):
    out = tmp_path / f"{backend}-{compression}.pt"
    launch_ok(
        launcher, 2, [WORKERS / "equivalence.py", backend, out, 1, "no_sync", f"compression={compression}"], timeout=180
    )
    return torch.load(out)


def max_difference(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "backend, launcher, compression",
    [
        ("ddp-gloo", "torchrun", "fp16"),
        ("ddp-gloo", "torchrun", "bf16"),
        pytest.param("horovod", "mpirun", "fp16", marks=requires_horovod),
    ],
)
def test_compressed_training_stays_within_the_wire_dtype_precision(
    tmp_path, float64_reference, backend, launcher, compression
):
    trained = compressed_run(tmp_path, backend, launcher, compression)
    difference = max_difference(trained, float64_reference)
    # Parameters stay below 0.3 here and 5 SGD steps move them a little: rounding each gradient
    # to the wire dtype moves them by about eps/30 (measured); eps/10 leaves room, and a tenth
    # of the next coarser dtype's error would already fail.
    assert difference <= EPS[compression] / 10, difference
    # Not bitwise the float64 result: the gradients really were rounded on the way.
    assert difference > 1e-9, "compression had no effect: the hook/compressor was not applied"


@pytest.mark.parametrize("backend", ["single", "dp"])
@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_one_process_backends_refuse_compression_at_construction(backend, compression):
    with pytest.raises(paraflow.ConfigurationError, match=f"{backend}.*{compression}.*supports: 'none'"):
        paraflow.get_backend(backend, compression=compression)


@requires_horovod
def test_horovod_refuses_bf16_compression_at_construction():
    with pytest.raises(paraflow.ConfigurationError, match="horovod.*bf16"):
        paraflow.get_backend("horovod", compression="bf16")


@pytest.mark.parametrize("compression", ["none", "fp16", "bf16"])
def test_ddp_gloo_accepts_every_compression(compression):
    assert paraflow.get_backend("ddp-gloo", compression=compression).compression == compression


def test_unknown_compression_lists_the_choices():
    with pytest.raises(paraflow.ConfigurationError, match="'none', 'fp16', 'bf16'"):
        paraflow.get_backend("ddp-gloo", compression="zstd")
