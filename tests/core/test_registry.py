"""Registry, backend selection, option pass-through and the errors for bad input."""

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import paraflow
from paraflow.backends.ddp.backend import DDPBackend
from paraflow.environment.launchers import ProcessEnvironment
from paraflow.errors import (
    BackendUnavailableError,
    ConfigurationError,
    LauncherError,
    ParaflowError,
    UnknownBackendError,
)

CORE = ["single", "dp", "ddp", "ddp-gloo", "ddp-nccl"]


def test_core_names_are_registered():
    assert set(CORE) <= set(paraflow.registered_names())


def test_available_backends_lists_every_name_with_a_reason_when_unavailable():
    available = paraflow.available_backends()
    assert set(available) == set(paraflow.registered_names())
    assert available["single"] is None and available["ddp-gloo"] is None
    if not torch.cuda.is_available():
        assert "CUDA" in available["ddp-nccl"]


def test_unknown_name_lists_known_ones():
    with pytest.raises(UnknownBackendError) as err:
        paraflow.get_backend("ddp-mpi")
    assert isinstance(err.value, ValueError) and isinstance(err.value, ParaflowError)
    for name in CORE:
        assert name in str(err.value)


def test_one_ddp_class_with_presets():
    assert type(paraflow.get_backend("ddp-gloo")) is DDPBackend
    assert paraflow.get_backend("ddp-gloo").process_group == "gloo"
    assert paraflow.get_backend("ddp-nccl").process_group == "nccl"
    assert paraflow.get_backend("ddp").process_group == "auto"


def test_ddp_options_pass_through_under_torch_names():
    backend = paraflow.get_backend(
        "ddp-gloo",
        bucket_cap_mb=7,
        gradient_as_bucket_view=True,
        static_graph=True,
        find_unused_parameters=False,
        num_threads=1,
    )
    assert backend.ddp_options == {
        "bucket_cap_mb": 7,
        "gradient_as_bucket_view": True,
        "static_graph": True,
        "find_unused_parameters": False,
    }
    with backend:
        model = backend.wrap_model(nn.Linear(3, 2))
        assert isinstance(model, DistributedDataParallel)
        assert model.static_graph and model.gradient_as_bucket_view
        assert model.bucket_bytes_cap == 7 * 1024 * 1024


def test_unknown_option_names_the_accepted_ones():
    with pytest.raises(ConfigurationError, match="bucket_cap_mb"):
        paraflow.get_backend("ddp-gloo", bucket_size=3)
    with pytest.raises(ConfigurationError, match="does not take option"):
        paraflow.get_backend("single", static_graf=True)  # another backend's option is ignored, a typo is not


def test_timeout_option_is_validated_and_used():
    assert paraflow.get_backend("ddp-gloo", timeout=42).timeout == 42
    with pytest.raises(ConfigurationError, match="timeout"):
        paraflow.get_backend("ddp-gloo", timeout=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error; this host has a GPU")
def test_ddp_nccl_without_cuda_says_what_to_use():
    with pytest.raises(BackendUnavailableError, match="ddp-gloo") as err:
        paraflow.init("ddp-nccl")
    assert isinstance(err.value, RuntimeError)


def test_default_backend_follows_env_var_then_launcher(monkeypatch):
    assert paraflow.default_backend_name(ProcessEnvironment("python")) == "single"
    assert paraflow.default_backend_name(ProcessEnvironment("torchrun", 0, 2, 0, 2)) == "ddp"
    monkeypatch.setenv("PARAFLOW_BACKEND", "dp")
    assert paraflow.default_backend_name(ProcessEnvironment("torchrun", 0, 2, 0, 2)) == "dp"


def test_init_with_no_name_runs_single_under_plain_python():
    with paraflow.init() as backend:
        assert backend.name == "single"
        assert (backend.rank, backend.world_size, backend.is_main) == (0, 1, True)


def test_requested_world_size_without_launcher_says_how_to_launch():
    with pytest.raises(LauncherError, match="torchrun --nproc_per_node 2"):
        paraflow.init("ddp-gloo", world_size=2)


@pytest.mark.parametrize("name", ["dp", "single"])
def test_one_process_backends_refuse_a_multi_process_launcher(name):
    backend = paraflow.get_backend(name)
    with pytest.raises(LauncherError, match="runs in one process") as err:
        backend.init(ProcessEnvironment("torchrun", 1, 2, 1, 2, "127.0.0.1", 29500))
    assert "--backend ddp" in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU pass-through; this host has a GPU")
def test_dp_on_cpu_is_a_pass_through_that_says_so(monkeypatch):
    from paraflow.backends.dp import DataParallelBackend

    monkeypatch.setattr(DataParallelBackend, "_warned_cpu", False)
    with pytest.warns(UserWarning, match="pass-through"), paraflow.init("dp") as backend:
        model = backend.wrap_model(nn.Linear(3, 2))
        assert isinstance(model, nn.DataParallel)
        x = torch.randn(4, 3)
        assert torch.equal(model(x), backend.unwrap(model)(x))


def test_threads_default_to_cores_per_local_process(monkeypatch):
    import paraflow.core.placement as placement

    monkeypatch.setattr(placement, "cores", lambda: 8)
    monkeypatch.delenv("PARAFLOW_NUM_THREADS", raising=False)
    assert placement.threads_per_process(None, local_world_size=4) == 2
    assert placement.threads_per_process(3, local_world_size=4) == 3


def test_use_before_init_is_a_clear_error():
    with pytest.raises(ParaflowError, match="call init"):
        paraflow.get_backend("single").allreduce(torch.ones(1))


def test_bad_collective_arguments():
    with paraflow.init("single") as backend:
        with pytest.raises(ConfigurationError, match="one of sum, mean, min, max"):
            backend.allreduce(torch.ones(2), op="avg")
        with pytest.raises(ConfigurationError, match="floating-point"):
            backend.allreduce(torch.ones(2, dtype=torch.int64), op="mean")
        with pytest.raises(ConfigurationError, match="src=3"):
            backend.broadcast(torch.ones(2), src=3)


def test_single_collectives_return_copies():
    with paraflow.init("single") as backend:
        x = torch.tensor([1.0, 2.0])
        for out in (backend.allreduce(x, "sum"), backend.broadcast(x), backend.allgather(x)[0]):
            out.add_(1)
        assert x.tolist() == [1.0, 2.0]
