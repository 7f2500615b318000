"""The collective sweep on 2 real ranks: every result of every collective checked element by element."""

import pytest
import torch
from conftest import launch_ok, read_rank_json, requires_horovod

from paraflow.bench.driver.config import BenchConfig
from paraflow.bench.driver.matrix import Cell
from paraflow.bench.driver.runner import worker_args

SIZES = [4096, 65536]
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast")


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "backend, launcher", [("ddp-gloo", "torchrun"), pytest.param("horovod", "mpirun", marks=requires_horovod)]
)
def test_every_collective_is_exact_on_every_rank(backend, launcher, tmp_path):
    config = BenchConfig(models=["mlp:width=16"], sizes=SIZES, collectives=list(COLLECTIVES), aa_check=False)
    cell = Cell("train", backend, launcher, 2, 1, (), sweep=True)  # no model: the sweep alone
    script = ["-m", "paraflow.bench.rank.worker", *worker_args(cell, config, tmp_path)]
    launch_ok(launcher, 2, script, timeout=200)
    for result in read_rank_json(tmp_path, 2):
        sweep = result["tasks"]["sweep"]
        assert sweep["unsupported"] == []
        rows = sweep["rows"]
        measured = {(r["collective"], r["impl"], r["bytes"]) for r in rows}
        assert measured == {(c, "raw", size) for c in COLLECTIVES for size in (4096, 65536)}  # the library's calls
        assert all(r["wrong"] == 0 for r in rows), [r for r in rows if r["wrong"]]
        assert all(r["time_s"] > 0 and len(r["round_s"]) == r["iters"] == rounds_for(r["bytes"]) for r in rows)


def rounds_for(size: int) -> int:
    from paraflow.bench.rank.sweep import ROUNDS, iterations_for

    return max(ROUNDS, iterations_for(size))


class _Public:
    """A one-rank stand-in for a backend with no raw library: records its calls."""

    device, world_size, rank, name = torch.device("cpu"), 1, 0, "stand-in"

    def __init__(self) -> None:
        self.calls: list = []

    def barrier(self) -> None:
        self.calls.append("barrier")

    def allreduce_(self, tensor, op="sum"):
        self.calls.append(op)
        return tensor


def test_without_a_raw_library_the_public_call_is_warmed_up_then_timed_each_round():
    from paraflow.bench.rank.sweep import MIN_WARMUP, run_sweep

    backend = _Public()
    result = run_sweep(backend, None, [64 * 1024**2], ["allreduce", "reduce_scatter"], rounds=5)
    # the fewest operations at 64 MB: the rounds' minimum decides; then one checked call
    assert backend.calls == ["sum"] * MIN_WARMUP + ["barrier"] + ["sum"] * 5 + ["sum"]
    (row,) = result["rows"]
    assert row["impl"] == "paraflow" and len(row["round_s"]) == 5 and row["wrong"] == 0
    (refused,) = result["unsupported"]  # paraflow has no public reduce_scatter
    assert refused["collective"] == "reduce_scatter" and "reduce_scatter" in refused["error"]
