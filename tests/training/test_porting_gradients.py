"""What ported DDP scripts do between backward and step, on every backend.

- clipping through backend.clip_grad_norm_ / clip_grad_value_ gives the same parameters, bit for
  bit, on one process accumulating the global batch, ddp-gloo, horovod (MPI and gloo
  controllers) and fsdp, and the same total norm on every rank;
- torch's own clip_grad_norm_ between backward and step, in float64, gives single's parameters
  there too: backward leaves the averaged gradient on every backend, horovod's included;
- no_sync around the forward only (the backward outside) reduces nothing on ddp-gloo, horovod
  and fsdp, and all three end with the same parameters;
- a model whose blocks sit in an nn.ModuleList wraps under fsdp with no option, sharded per
  block, and trains to ddp-gloo's parameters.

The worker, tests/workers/porting_gradients.py, is written as a user writes a training script.
"""

import json

import pytest
import torch
from conftest import WORKERS, launch_ok, requires_horovod
from torch import nn

import paraflow
from paraflow.backends.fsdp.wrap import choose_blocks
from paraflow.errors import ConfigurationError

# Its tests share launches (a module-scoped fixture): under `pytest -n 2 --dist loadgroup` they stay in one process.
pytestmark = pytest.mark.xdist_group("porting-gradients")

SCRIPT = WORKERS / "porting_gradients.py"
MAX_NORM = 0.05  # as in the worker
RUNS = {
    "ddp-gloo": ("ddp-gloo", "torchrun"),
    "fsdp": ("fsdp", "torchrun"),
    "horovod-mpi": ("horovod", "mpirun"),
    "horovod-gloo": ("horovod", "horovodrun"),
}


MODES = ("clip", "value", "no_sync", "plain", "torch_clip")


def run(directory, kind):
    """Train under `kind` (a RUNS key, or "single") in every mode, in one job: per mode, the final
    parameters and each rank's report."""
    backend, launcher = RUNS.get(kind, ("single", "python"))
    nproc = 1 if kind == "single" else 2
    out = directory / kind
    out.mkdir()
    launch_ok(launcher, nproc, [SCRIPT, backend, out, ",".join(MODES)], timeout=240)
    results = {}
    for mode in MODES:
        params = out / f"{mode}.pt"
        reports = [json.loads(params.with_name(f"{params.name}.rank{r}.json").read_text()) for r in range(nproc)]
        results[mode] = torch.load(params, weights_only=True), reports
    return results


def assert_bit_identical(a, b):
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, {k: (a[k] - b[k]).abs().max().item() for k in different}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Lazily, per kind: one job each, shared by the tests of this module."""
    directory = tmp_path_factory.mktemp("porting-gradients")
    cache = {}

    def get(kind, mode):
        if kind not in cache:
            cache[kind] = run(directory, kind)
        return cache[kind][mode]

    return get


def _kinds(*kinds):
    return [pytest.param(k, marks=requires_horovod) if k.startswith("horovod") else k for k in kinds]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", _kinds("ddp-gloo", "horovod-mpi", "horovod-gloo", "fsdp"))
def test_clip_grad_norm_between_backward_and_step_matches_one_process_bit_for_bit(reference, kind):
    single, (single_report,) = reference("single", "clip")
    trained, reports = reference(kind, "clip")
    assert_bit_identical(trained, single)
    norms = single_report["norms"]
    assert all(n > MAX_NORM for n in norms), f"the guard: every step must clip, norms {norms}"
    assert [r["norms"] for r in reports] == [norms, norms], "the total norm differs between ranks or from single"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", _kinds("ddp-gloo", "horovod-mpi", "horovod-gloo", "fsdp"))
def test_torchs_own_clip_grad_norm_after_backward_matches_one_process(reference, kind):
    """The gradient is the averaged one when backward() returns, on every backend (horovod
    included), so torch's own clipping, unchanged from a one-process script, trains single's model."""
    single, (single_report,) = reference("single", "torch_clip")
    trained, reports = reference(kind, "torch_clip")
    assert trained.keys() == single.keys()
    for key in single:
        assert single[key].dtype == torch.float64
        torch.testing.assert_close(trained[key], single[key], rtol=0, atol=1e-9, msg=key)
    norms = single_report["norms"]
    assert all(n > MAX_NORM for n in norms), f"the guard: every step must clip, norms {norms}"
    for report in reports:
        assert report["norms"] == pytest.approx(norms, rel=1e-9, abs=0), "a rank clipped by another norm than single"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", _kinds("ddp-gloo", "horovod-mpi", "fsdp"))
def test_clip_grad_value_matches_one_process_bit_for_bit(reference, kind):
    assert_bit_identical(reference(kind, "value")[0], reference("single", "value")[0])


@pytest.mark.timeout(300)
def test_clipping_changes_the_result(reference):
    """Guards the comparisons above: clipped and unclipped training must differ."""
    plain = reference("single", "plain")[0]
    for mode in ("clip", "value"):
        clipped = reference("single", mode)[0]
        assert any(not torch.equal(plain[k], clipped[k]) for k in plain), mode


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", _kinds("horovod-mpi", "horovod-gloo", "fsdp"))
def test_no_sync_around_the_forward_only_accumulates_as_on_ddp(reference, kind):
    ddp, ddp_reports = reference("ddp-gloo", "no_sync")
    trained, reports = reference(kind, "no_sync")
    assert_bit_identical(trained, ddp)
    for report in [*ddp_reports, *reports]:
        first, second = zip(*report["sent"])
        assert set(first) == {0}, f"the backward of a forward inside no_sync sent gradients: {report['sent']}"
        assert all(s > 0 for s in second), f"the backward after it sent nothing: {report['sent']}"


@pytest.mark.timeout(300)
def test_a_model_with_blocks_in_a_module_list_shards_per_block_and_trains_as_on_ddp(reference):
    trained, reports = reference("fsdp", "plain")
    assert reports[0]["blocks"] == ["h.0", "h.1", "h.2", "h.3"]
    assert_bit_identical(trained, reference("ddp-gloo", "plain")[0])


# ---------------------------------------------------------------- in this process
class _Stack(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_the_automatic_choice_takes_the_blocks_inside_a_module_list():
    model = _Stack(64)  # 3 x 4,160 parameters: the list reaches the threshold, no block does
    chosen = choose_blocks(model, None, min_block_params=10_000)
    assert chosen == list(model.layers)


def test_naming_a_container_as_blocks_says_which_classes_to_name():
    with pytest.raises(ConfigurationError, match=r"ModuleList, a container without forward.*blocks='Sequential'"):
        choose_blocks(_Stack(), ("ModuleList",), min_block_params=1)


def test_single_clips_as_torch_does_and_its_optimizer_synchronizes_as_horovods():
    with paraflow.init("single", num_threads=1, banner=False) as backend:
        torch.manual_seed(0)
        model = backend.wrap_model(_Stack())
        optimizer = backend.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
        model(torch.randn(4, 8)).square().sum().backward()
        expected = [p.grad.clone() for p in model.parameters()]
        torch_norm = torch.nn.utils.get_total_norm(expected)
        optimizer.synchronize()  # a Horovod script's call: nothing to do here
        norm = backend.clip_grad_norm_(model, 0.1)
        torch.testing.assert_close(norm, torch_norm)
        factor = 0.1 / (norm + 1e-6)
        for grad, before in zip((p.grad for p in model.parameters()), expected):
            torch.testing.assert_close(grad, before * factor)
        assert backend.clip_grad_norm_(model, 1.0, norm_type=float("inf")) == max(
            p.grad.abs().max() for p in model.parameters()
        )
        with optimizer.skip_synchronize():
            optimizer.step()
        for bad in (-1, "two", 0):
            with pytest.raises(ConfigurationError, match="norm_type"):
                backend.clip_grad_norm_(model, 1.0, norm_type=bad)
        with pytest.raises(ConfigurationError, match="max_norm"):
            backend.clip_grad_norm_(model, -1.0)
        with pytest.raises(ConfigurationError, match="clip_value"):
            backend.clip_grad_value_(model, float("nan"))
