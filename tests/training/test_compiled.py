"""Compiled models on every backend (docs/compile.md).

- a float64 loop with ``backend.wrap_model(torch.compile(m))``, with ``torch.compile(backend.wrap_model(m))``
  and with ``backend.wrap_model(m, compile={...})`` ends with single's parameters (within 1e-9) on dp,
  ddp-gloo (torchrun), horovod (mpirun) and fsdp (torchrun), and the compile backend passed to
  torch.compile is called on every rank: the compiled graph runs, not an eager fallback;
- DDP's compiler splits the graph at the buckets; horovod's gradient is the averaged one when a
  compiled backward returns;
- where torch's compiler would run a model eagerly without a word, paraflow refuses it and says why.

The worker, tests/workers/compiled.py, trains every order in one job per backend.
"""

import json
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, WORKERS, launch_ok, requires_gpu, requires_horovod
from torch import nn

import paraflow
from paraflow.errors import ConfigurationError

# Its tests share launches (a module-scoped fixture): under `pytest -n 2 --dist loadgroup` they stay in one process.
pytestmark = pytest.mark.xdist_group("compiled")

SCRIPT = WORKERS / "compiled.py"
COUNTED = ("wrap_compiled", "compile_wrapped", "compile_option")
ORDERS = (*COUNTED, "eager", "checkpoint")
RUNS = {
    "single": ("single", "python", 1),
    "dp": ("dp", "python", 1),
    "ddp-gloo": ("ddp-gloo", "torchrun", 2),
    "fsdp": ("fsdp", "torchrun", 2),
    "horovod": ("horovod", "mpirun", 2),
}


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
    """One inductor and Triton cache for the session, shared by every launched rank."""
    directory = tmp_path_factory.mktemp("torch-compile-cache")
    return {"TORCHINDUCTOR_CACHE_DIR": str(directory), "TRITON_CACHE_DIR": str(directory / "triton")}


def run(directory, kind, orders, cache, timeout=240):
    """Train under `kind` in every order of `orders`, in one job: per order, the parameters and each rank's report."""
    backend, launcher, nproc = RUNS[kind]
    out = directory / kind
    out.mkdir(exist_ok=True)
    launch_ok(launcher, nproc, [SCRIPT, backend, out, ",".join(orders)], timeout=timeout, env=cache)
    results = {}
    for order in orders:
        reports = [json.loads((out / f"{order}.rank{r}.json").read_text()) for r in range(nproc)]
        results[order] = torch.load(out / f"{order}.pt", weights_only=True), reports
    return results


@pytest.fixture(scope="module")
def trained(tmp_path_factory, compile_cache):
    """Lazily, per kind: one job each, shared by the tests of this module."""
    directory = tmp_path_factory.mktemp("compiled")
    cache = {}

    def get(kind, order):
        if kind not in cache:
            cache[kind] = run(directory, kind, ORDERS, compile_cache)
        return cache[kind][order]

    return get


def assert_close(trained, reference):
    assert trained.keys() == reference.keys()
    for key in reference:
        assert reference[key].dtype == torch.float64
        torch.testing.assert_close(trained[key], reference[key], rtol=0, atol=1e-9, msg=key)


def _kinds(*kinds):
    return [pytest.param(k, marks=requires_horovod) if k == "horovod" else k for k in kinds]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("order", COUNTED)
@pytest.mark.parametrize("kind", _kinds("single", "dp", "ddp-gloo", "horovod", "fsdp"))
def test_a_compiled_model_trains_singles_parameters_and_its_graph_runs(trained, kind, order):
    params, reports = trained(kind, order)
    assert_close(params, trained("single", "eager")[0])
    for rank, report in enumerate(reports):
        assert report["graphs"], f"rank {rank}: the compile backend was never called ({order}): it ran eagerly"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", _kinds("single", "ddp-gloo", "horovod", "fsdp"))
def test_the_guard_eager_training_compiles_nothing_and_matches_single(trained, kind):
    """Guards the test above: the counted graphs come from torch.compile."""
    params, reports = trained(kind, "eager")
    assert all(report["graphs"] == [] for report in reports)
    assert_close(params, trained("single", "eager")[0])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", _kinds("single", "ddp-gloo", "horovod", "fsdp"))
def test_a_checkpoint_of_a_compiled_model_has_the_modules_keys_and_loads_into_a_compiled_one(trained, kind):
    params, reports = trained(kind, "checkpoint")
    for report in reports:
        assert report["keys"] == sorted(params) and not any("_orig_mod" in k for k in report["keys"])
        assert report["restored"], "the loaded parameters differ from the saved ones"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("order", COUNTED)
def test_ddps_compiler_splits_the_graph_at_its_buckets(trained, order):
    (single_graphs,) = [r["graphs"] for r in trained("single", order)[1]]
    _, reports = trained("ddp-gloo", order)
    assert len(single_graphs) == 1
    for report in reports:
        assert len(report["graphs"]) > 1, f"one graph for 2.1 MB of parameters in 1 MB buckets: {report['graphs']}"
        assert sum(report["graphs"]) > single_graphs[0], "the split graphs hold less than the whole model's"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("order", COUNTED)
@pytest.mark.parametrize("kind", _kinds("ddp-gloo", "horovod"))
def test_backward_of_a_compiled_model_leaves_the_averaged_gradient(trained, kind, order):
    """Horovod's hooks sit on the parameters' gradient accumulators, which AOTAutograd's backward
    still feeds: paraflow's wait at the end of backward sees the averaged gradient, as on DDP."""
    _, reports = trained(kind, order)
    single = trained("single", order)[1][0]["grads"]
    for report in reports:
        assert report["grads"] == pytest.approx(single, rel=1e-9, abs=1e-12)


@requires_gpu
@pytest.mark.timeout(300)
def test_ddp_nccl_trains_a_compiled_model_in_both_orders(tmp_path, compile_cache):
    """On GPUs: ddp-nccl, one rank per GPU (at most two)."""
    nproc = min(2, torch.cuda.device_count())
    out = tmp_path / "ddp-nccl"
    out.mkdir()
    launch_ok("torchrun", nproc, [SCRIPT, "ddp-nccl", out, ",".join(COUNTED)], timeout=240, env=compile_cache)
    for order in COUNTED:
        for r in range(nproc):
            assert json.loads((out / f"{order}.rank{r}.json").read_text())["graphs"], order


@pytest.mark.timeout(600)
def test_torchs_own_compiler_trains_singles_parameters_on_ddp(tmp_path, compile_cache):
    """wrap_model(model, compile=True): inductor, C++ code generation included."""
    single = run(tmp_path, "single", ["eager"], compile_cache)["eager"][0]
    params, reports = run(tmp_path, "ddp-gloo", ["inductor"], compile_cache, timeout=540)["inductor"]
    assert_close(params, single)
    assert all(report["type"] == "CheckedDistributedDataParallel" for report in reports)


TRAIN_COMMAND = "paraflow run -n 2 --backend fsdp train.py --compile --epochs 1"


@pytest.mark.timeout(300)
def test_train_py_compile_runs_as_the_docs_print_it(no_leftovers, compile_cache):
    assert TRAIN_COMMAND in (ROOT / "docs" / "compile.md").read_text()
    cmd = [sys.executable, "-m", "paraflow.cli", *TRAIN_COMMAND.split()[1:]]
    done = subprocess.run(
        cmd, env={**no_leftovers, **compile_cache}, cwd=str(ROOT), capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "held-out accuracy" in done.stdout + done.stderr


# ---------------------------------------------------------------- in this process
def _counting(gm, example_inputs):
    return gm.forward


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["ddp-gloo", "fsdp"])
def test_a_torch_module_that_would_run_eagerly_under_the_compiler_is_refused(name):
    with paraflow.init(name, num_threads=1, banner=False) as backend:
        model = torch.compile(backend.wrap_model(nn.Sequential(nn.Linear(4, 4))), backend=_counting)
        with pytest.raises(ConfigurationError, match="would not compile") as caught:
            model(torch.randn(2, 4))
        assert "wrap_model(torch.compile(model))" in str(caught.value) or "a forward of your own" in str(caught.value)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["ddp-gloo", "fsdp"])
@pytest.mark.parametrize("order", ["compile_option", "wrap_compiled"])
def test_a_torch_module_compiles_in_paraflows_order(name, order):
    """Every operation of torch's own modules runs compiled: ddp compiles inside DDP, fsdp
    compiles each sharded block's forward (FSDP2's hooks break the graph around each)."""
    calls = []

    def counting(gm, example_inputs):
        calls.append(sum(node.op == "call_function" for node in gm.graph.nodes))
        return gm.forward

    def stack():
        torch.manual_seed(0)
        # each block different: the compiler would reuse one block's graph for the next, uncounted
        blocks = [nn.Sequential(nn.Linear(64, 64), activation()) for activation in (nn.Tanh, nn.ReLU, nn.Sigmoid)]
        return nn.Sequential(*blocks) if name == "ddp-gloo" else _Stack(blocks)  # fsdp: see the next test

    torch._dynamo.reset()
    whole = torch.compile(stack(), backend=counting)
    whole(torch.randn(2, 64)).sum().backward()
    operations = sum(calls)
    calls.clear()
    torch._dynamo.reset()  # else the same code, compiled above, would not reach the backend again
    with paraflow.init(name, num_threads=1, banner=False, blocks="Sequential") as backend:
        if order == "compile_option":
            model = backend.wrap_model(stack(), compile={"backend": counting})
        else:
            model = backend.wrap_model(torch.compile(stack(), backend=counting))
        model(torch.randn(2, 64)).sum().backward()
    assert calls, "the compile backend was not called"
    assert sum(calls) >= operations, f"graphs of {calls} operations, the whole model has {operations}: some ran eagerly"


class _Stack(nn.Module):
    def __init__(self, blocks: list) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.timeout(120)
def test_fsdp_refuses_to_compile_a_torch_module_whose_blocks_it_shards():
    with paraflow.init("fsdp", num_threads=1, banner=False, blocks="Linear") as backend:
        with pytest.raises(ConfigurationError, match="module of your own"):
            backend.wrap_model(nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4)), compile=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "compile, words",
    [({"bogus": 1}, "does not take"), ("yes", "pass True, False"), (1, "pass True, False")],
)
def test_bad_compile_options_name_the_accepted_ones(compile, words):
    with paraflow.init("single", banner=False) as backend, pytest.raises(ConfigurationError, match=words):
        backend.wrap_model(nn.Linear(2, 2), compile=compile)


@pytest.mark.timeout(60)
def test_compiling_a_compiled_model_again_is_refused_and_unwrap_gives_the_module():
    module = nn.Linear(2, 2)
    with paraflow.init("single", banner=False) as backend:
        compiled = backend.wrap_model(module, compile={"backend": _counting})
        assert backend.unwrap(compiled) is module
        assert backend.unwrap(compiled).state_dict().keys() == module.state_dict().keys()
        with pytest.raises(ConfigurationError, match="twice"):
            backend.wrap_model(compiled, compile=True)


@pytest.mark.timeout(60)
def test_compiled_ddp_needs_buckets_the_compiler_accepts():
    with paraflow.init("ddp-gloo", num_threads=1, banner=False, bucket_cap_mb=0.5) as backend:
        with pytest.raises(ConfigurationError, match="bucket_cap_mb=1"):
            backend.wrap_model(nn.Linear(2, 2), compile=True)
