"""One script, every backend: portable options, wrap_optimizer without the model, paraflow.current().

tests/workers/portable.py carries horovod's and DDP's tuning options at once, wraps its optimizer
without the model and finds the backend through paraflow.current() inside the loop; it runs
unchanged under plain python (single), torchrun (ddp-gloo, fsdp), mpirun and horovodrun (horovod).
"""

import pytest
from conftest import WORKERS, launch_ok, read_rank_json, requires_horovod

# Its tests share launches (a module-scoped fixture): under `pytest -n 2 --dist loadgroup` they stay in one process.
pytestmark = pytest.mark.xdist_group("portable")

RUNS = [
    pytest.param("single", "python", 1, id="single-python"),
    pytest.param("ddp-gloo", "torchrun", 2, id="ddp-gloo-torchrun"),
    pytest.param("fsdp", "torchrun", 2, id="fsdp-torchrun"),
    pytest.param("horovod", "mpirun", 2, id="horovod-mpirun", marks=requires_horovod),
    pytest.param("horovod", "horovodrun", 2, id="horovod-horovodrun", marks=requires_horovod),
]
IGNORED = {
    "single": ["broadcast_buffers", "bucket_cap_mb", "fusion_threshold_mb", "gradient_as_bucket_view", "reduce_op"],
    "ddp-gloo": ["fusion_threshold_mb", "reduce_op"],
    "fsdp": ["broadcast_buffers", "bucket_cap_mb", "fusion_threshold_mb", "gradient_as_bucket_view", "reduce_op"],
    "horovod": ["broadcast_buffers", "bucket_cap_mb", "gradient_as_bucket_view"],
}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Launch each run once, when a test first asks for it: (stderr, per-rank results)."""
    cache = {}

    def get(backend: str, launcher: str, nproc: int):
        key = (backend, launcher)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{backend}-{launcher}")
            result = launch_ok(launcher, nproc, [WORKERS / "portable.py", backend, out], timeout=150)
            cache[key] = (result.stderr, read_rank_json(out, nproc))
        return cache[key]

    return get


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend, launcher, nproc", RUNS)
def test_the_same_script_runs_unchanged_and_ignores_the_other_backends_options(launched, backend, launcher, nproc):
    stderr, ranks = launched(backend, launcher, nproc)
    for rank, result in enumerate(ranks):
        assert (result["rank"], result["world_size"]) == (rank, nproc)
        assert result["ignored"] == IGNORED[backend]
    # One line, on rank 0 only, naming whose options they are; and the start-up banner.
    assert stderr.count(f"paraflow: backend '{backend}' ignores option(s) of other backends") == 1, stderr[-2000:]
    assert ("reduce_op (horovod)" in stderr) == (backend != "horovod"), stderr[-2000:]
    assert stderr.count(f"paraflow: {backend}") == 1, stderr[-2000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend, launcher, nproc", RUNS)
def test_current_inside_the_loop_is_the_initialised_backend(launched, backend, launcher, nproc):
    _, ranks = launched(backend, launcher, nproc)
    for rank, result in enumerate(ranks):
        assert len(result["seen"]) == 5
        for seen in result["seen"]:
            assert seen == {"current_id": result["backend_id"], "rank": rank, "world_size": nproc}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend, launcher, nproc", RUNS[1:])
def test_wrap_optimizer_without_the_model_trains_identically_everywhere(launched, backend, launcher, nproc):
    """DDP, fsdp and horovod (both controllers) average the ranks' gradients: the whole batch in one process."""
    reference = launched("single", "python", 1)[1][0]["params"]
    for result in launched(backend, launcher, nproc)[1]:
        assert len(result["params"]) == len(reference) == 2
        for got, want in zip(result["params"], reference):
            assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
