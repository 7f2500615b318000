"""paraflow.compat.horovod in one process: its errors, its names, SyncBatchNorm's arithmetic, and the
import hook that makes `import horovod.torch` the drop-in."""

import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from torch import nn

import paraflow
import paraflow.compat.horovod as hvd
from paraflow.compat.horovod import layers, runtime
from paraflow.tools import horovod_api
from paraflow.tools.run import plan_run


@pytest.fixture
def started(monkeypatch):
    monkeypatch.setenv("PARAFLOW_BANNER", "0")
    hvd.init()
    yield hvd
    hvd.shutdown()


def test_before_init_a_call_says_to_call_hvd_init():
    assert not hvd.is_initialized()
    with pytest.raises(paraflow.NotInitializedError, match=r"hvd\.init\(\)"):
        hvd.rank()


def test_in_one_process_every_collective_gives_the_tensor_itself(started):
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()) == (
        0,
        1,
        0,
        1,
        0,
        1,
    )
    assert runtime.backend() is paraflow.current() and hvd.is_homogeneous() and not hvd.mpi_enabled()
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(hvd.allreduce(t), t) and torch.equal(hvd.allgather(t.view(2, 1)), t.view(2, 1))
    assert torch.equal(hvd.broadcast(t, 0), t) and torch.equal(hvd.alltoall(t), t)
    assert torch.equal(hvd.synchronize(hvd.allreduce_async(t, op=hvd.Sum)), t)
    assert hvd.broadcast_object({"a": 1}) == {"a": 1} and hvd.allgather_object(3) == [3]
    assert hvd.join() == 0
    hvd.barrier()


def test_hvd_init_joins_a_backend_the_script_started_and_leaves_it_running(monkeypatch):
    monkeypatch.setenv("PARAFLOW_BANNER", "0")
    with paraflow.init("single") as backend:
        hvd.init()
        assert runtime.backend() is backend and hvd.size() == 1
        hvd.shutdown()
        assert not hvd.is_initialized() and paraflow.current() is backend  # still the script's


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum), ["hvd.Adasum", "op=hvd.Average", "--backend horovod"]),
        (lambda: hvd.allreduce(torch.ones(2), op=hvd.Average, average=True), ["not both"]),
        (lambda: hvd.allreduce(torch.ones(2), process_set=object()), ["process sets", "new_group"]),
        (lambda: hvd.allreduce([1.0]), ["torch.Tensor", "list"]),
        (lambda: hvd.broadcast(torch.ones(2), root_rank=3), ["root_rank=3", "0..0"]),
        (lambda: hvd.synchronize(12345), ["handle 12345"]),
        (lambda: hvd.reducescatter(torch.ones(2), op=hvd.Max), ["hvd.Average or hvd.Sum"]),
        (lambda: hvd.alltoall(torch.ones(3), splits=[2]), ["splits=[2]"]),
    ],
)
def test_bad_input_is_a_configuration_error_naming_what_to_do(started, call, words):
    with pytest.raises(paraflow.ConfigurationError) as error:
        call()
    for word in words:
        assert word in str(error.value)


@pytest.mark.parametrize(
    "name, instead",
    [("start_timeline", "torch.profiler"), ("ProcessSet", "new_group"), ("no_such_thing", "Migrating from Horovod")],
)
def test_a_name_the_api_lacks_raises_naming_it_and_what_to_use(name, instead):
    with pytest.raises(AttributeError) as error:
        getattr(hvd, name)
    assert f"hvd.{name} is not part of paraflow's Horovod API" in str(error.value) and instead in str(error.value)
    with pytest.raises(AttributeError, match="comm="):
        hvd.init(comm=[0, 1])


def test_elastic_is_paraflows_elastic_with_horovod_elastics_names(monkeypatch):
    import paraflow.elastic

    monkeypatch.setattr(runtime, "native", lambda: None)
    assert hvd.elastic is paraflow.elastic
    for name in ("run", "TorchState", "ElasticSampler"):
        assert callable(getattr(hvd.elastic, name)), name


def test_distributed_optimizer_keeps_the_optimizer_class_and_refuses_what_horovod_refuses(started):
    model = nn.Linear(3, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.param_groups[0]["lr"] == 0.1
    model(torch.ones(1, 3)).sum().backward()
    optimizer.synchronize()
    with optimizer.skip_synchronize():
        optimizer.step()
    for kwargs, words in [
        ({"op": hvd.Adasum}, "hvd.Adasum"),
        ({"op": hvd.Sum, "gradient_predivide_factor": 2.0}, "op=hvd.Average only"),
        ({"backward_passes_per_step": 0}, "must be > 0"),
        ({"named_parameters": [("w", model.weight)]}, "not in it"),
        ({"named_parameters": [("w", model.weight), ("w", model.bias)]}, "unique"),
    ]:
        with pytest.raises(paraflow.ConfigurationError, match=words):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)


def test_broadcast_optimizer_state_takes_horovods_zero_gradient_step_on_a_fresh_optimizer(started):
    model = nn.Linear(3, 2)
    adam = torch.optim.Adam(model.parameters(), lr=0.1)
    hvd.broadcast_optimizer_state(adam, root_rank=0)
    assert int(adam.state[model.weight]["step"]) == 1  # as Horovod: the state exists, to be sent


class Doubled(torch.autograd.Function):
    """A second rank holding the same batch: every sum doubles, forward and backward."""

    @staticmethod
    def forward(ctx, tensor):
        return tensor * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def test_sync_batch_norm_on_the_cpu_normalises_over_every_ranks_batch(monkeypatch):
    """On two ranks with the same batch x, SyncBatchNorm must give BatchNorm over [x; x]: its output,
    input gradient, affine gradients (summed over ranks) and running statistics."""
    monkeypatch.setattr(hvd, "size", lambda: 2)
    monkeypatch.setattr(hvd, "allreduce", lambda t, op=None: Doubled.apply(t))
    torch.manual_seed(0)
    x = torch.randn(5, 3, 4, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(5, 3, 4, dtype=torch.float64)
    sync, plain = layers.SyncBatchNorm(3).double(), nn.BatchNorm1d(3).double()
    with torch.no_grad():
        for bn in (sync, plain):
            bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
            bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    (sync(x) * weights).sum().backward()
    both = torch.cat([x, x]).detach().requires_grad_()
    expected = plain(both)
    (expected * torch.cat([weights, weights])).sum().backward()
    sync_out = layers.SyncBatchNorm(3).double()
    sync_out.load_state_dict(
        {
            **sync.state_dict(),
            "running_mean": torch.zeros(3),
            "running_var": torch.ones(3),
            "num_batches_tracked": torch.tensor(0),
        }
    )
    torch.testing.assert_close(sync_out(x.detach()), expected[:5].detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(x.grad, both.grad[:5], rtol=0, atol=1e-12)
    torch.testing.assert_close(sync.weight.grad * 2, plain.weight.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(sync.running_mean, plain.running_mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(sync.running_var, plain.running_var, rtol=0, atol=1e-12)


def test_compression_fp16_sends_half_and_restores_the_dtype():
    sent, ctx = hvd.Compression.fp16.compress(torch.tensor([1.0, 2.5], dtype=torch.float64))
    assert sent.dtype == torch.float16 and hvd.Compression.fp16.decompress(sent, ctx).dtype == torch.float64
    assert hvd.Compression.none.compress(torch.ones(1))[1] is None


# ---------------------------------------------------------------- the import hook
def run_python(code):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{horovod_api.SITE_DIR}:{ROOT}", "PARAFLOW_BANNER": "0"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_the_hook_makes_horovod_torch_the_drop_in_and_names_what_it_lacks():
    code = (
        "import horovod.torch as hvd, paraflow.compat.horovod as drop_in\n"
        "from horovod.torch.mpi_ops import allreduce\n"
        "assert hvd is drop_in and allreduce is drop_in.allreduce, hvd\n"
        "hvd.init(); print('size', hvd.size())\n"
        "import horovod.torch.timeline\n"
    )
    done = run_python(code)
    assert "size 1" in done.stdout, done.stderr
    assert "horovod.torch.timeline is not part of paraflow's Horovod API" in done.stderr


def test_paraflow_run_horovod_api_puts_the_hook_first_on_the_jobs_path():
    plan = plan_run(["train_hvd.py"], 2, "ddp-gloo", horovod_api=True, must_exist=False, env={"PYTHONPATH": "/x"})
    assert plan.env["PYTHONPATH"] == f"{horovod_api.SITE_DIR}:/x"
    assert "PYTHONPATH" not in plan_run(["train_hvd.py"], 2, "ddp-gloo", must_exist=False, env={}).env
