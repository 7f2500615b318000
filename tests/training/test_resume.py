"""Resume equivalence through train.py: 2N steps straight equal N steps, a restart, and N more.

Every run is 2 ranks in fresh processes, with 2-batch gradient accumulation; the halfway point
falls inside an epoch, so resuming also has to pick up the data order part-way through.
"""

import pytest
import torch
from conftest import ROOT, launch_ok, requires_horovod

# Its tests share launches (a module-scoped fixture): under `pytest -n 2 --dist loadgroup` they stay in one process.
pytestmark = pytest.mark.xdist_group("resume")

TRAIN = ROOT / "train.py"
HALF = 3  # optimizer steps; 4 batches per rank per epoch at 2 batches per step: step 3 is mid-epoch
LAUNCHERS = {"ddp-gloo": "torchrun", "horovod": "mpirun"}
BACKENDS = ["ddp-gloo", pytest.param("horovod", marks=requires_horovod)]


def train(directory, backend, name, steps, resume=None):
    checkpoint = directory / f"{name}.pt"
    argv = [
        TRAIN,
        "--backend",
        backend,
        "--data",
        "synthetic",
        "--batch-size",
        512,
        "--epochs",
        10,
        "--accumulation-steps",
        2,
        "--max-steps",
        steps,
        "--checkpoint",
        checkpoint,
    ]
    launch_ok(LAUNCHERS[backend], 2, argv + (["--resume", resume] if resume else []), timeout=150)
    return checkpoint


def load(path):
    return torch.load(path, weights_only=True)["state"]


def assert_bitwise_equal(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_bitwise_equal(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bitwise_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_training_state(resumed, straight):
    for key in ("model", "optimizer", "progress", "sampler"):
        assert_bitwise_equal(resumed[key], straight[key], key)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per backend, lazily: the straight 2N-step run and the N-step run to resume from."""
    directory = tmp_path_factory.mktemp("resume")
    cache = {}

    def get(backend, kind):
        if (backend, kind) not in cache:
            steps = 2 * HALF if kind == "straight" else HALF
            cache[backend, kind] = train(directory, backend, f"{backend}-{kind}", steps)
        return cache[backend, kind]

    return get


@pytest.mark.timeout(480)
@pytest.mark.parametrize("backend", BACKENDS)
def test_resumed_run_is_bitwise_equal_to_the_straight_run(tmp_path, runs, backend):
    straight = load(runs(backend, "straight"))
    half = load(runs(backend, "half"))
    assert half["progress"] == {"epoch": 1, "sample": 2 * 512 * 2, "step": HALF}  # 2 batches of 512 on 2 ranks
    resumed = load(train(tmp_path, backend, "resumed", 2 * HALF, resume=runs(backend, "half")))
    assert straight["progress"]["step"] == 2 * HALF
    assert_same_training_state(resumed, straight)
    # Guard: the second half really trained (a resume that did nothing would not match anyway).
    assert not torch.equal(half["model"]["net.1.weight"], straight["model"]["net.1.weight"])


@pytest.mark.timeout(480)
@pytest.mark.parametrize("writer, reader", [("horovod", "ddp-gloo"), ("ddp-gloo", "horovod")])
@requires_horovod
def test_checkpoint_resumes_under_the_other_backend(tmp_path, runs, writer, reader):
    resumed = load(train(tmp_path, reader, f"{writer}-to-{reader}", 2 * HALF, resume=runs(writer, "half")))
    # Both average two ranks' gradients exactly (a sum and a halving), so even across libraries
    # the result is bitwise the reader's own straight run.
    assert_same_training_state(resumed, load(runs(reader, "straight")))
