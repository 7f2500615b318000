"""Every collective on 2 real ranks against hand-computed results, for every backend and launcher."""

import pytest
from conftest import WORKERS, launch_ok, read_rank_json, requires_horovod

NPROC = 2

# (backend, launcher): one suite for every multi-process backend.
CASES = [
    ("ddp-gloo", "torchrun"),
    ("ddp-gloo", "mpirun"),
    ("horovod", "mpirun"),
    ("horovod", "horovodrun"),
    ("horovod", "torchrun"),
]


def contribution(rank):
    return [rank + 1, 2 * rank - 3, 10 * rank]


def expected(n):
    rows = [contribution(r) for r in range(n)]
    columns = list(zip(*rows))
    return {
        "sum": [sum(c) for c in columns],
        "min": [min(c) for c in columns],
        "max": [max(c) for c in columns],
        "mean": [sum(c) / n for c in columns],
        "rows": rows,
    }


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "backend, launcher",
    [pytest.param(*c, marks=requires_horovod if c[0] == "horovod" else ()) for c in CASES],
    ids=[f"{b}-{launcher}" for b, launcher in CASES],
)
def test_collectives_match_hand_computed_results(backend, launcher, tmp_path):
    launch_ok(launcher, NPROC, [WORKERS / "collectives.py", backend, tmp_path], timeout=180)
    results = read_rank_json(tmp_path, NPROC)
    want = expected(NPROC)
    torch_dtype = {"float32": "torch.float32", "float64": "torch.float64", "int64": "torch.int64"}
    for rank, res in enumerate(results):
        assert res["meta"] == {"rank": rank, "world_size": NPROC, "name": backend}
        for dtype in ("float32", "float64", "int64"):
            ops = ["sum", "min", "max"] + (["mean"] if dtype != "int64" else [])
            for op in ops:
                values, out_dtype = res[f"allreduce/{op}/{dtype}"]
                assert values == pytest.approx(want[op]), (rank, op, dtype)
                assert out_dtype == torch_dtype[dtype], (rank, op, dtype)
            for src in range(NPROC):
                assert res[f"broadcast/{src}/{dtype}"] == want["rows"][src], (rank, src, dtype)
            assert res[f"allgather/{dtype}"] == want["rows"], (rank, dtype)
            assert res[f"unchanged/{dtype}"] is True, (rank, dtype)
